package bench

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// LoadConfig is a load to push at a service.
type LoadConfig struct {
	Runs          int
	Conversations int
	Clients       int // each with its own MCP session
	Language      string
	Code          string
	// Prefix names the conversations (Prefix-0 …).
	Prefix string
	// NewEach runs every program in a conversation of its own.
	NewEach bool
}

// LoadResult is what a load measured.
type LoadResult struct {
	Runs       int
	Errors     int
	FirstError string
	Elapsed    time.Duration
	Latency    Stats
}

// Throughput is runs per second.
func (r LoadResult) Throughput() float64 { return float64(r.Runs) / r.Elapsed.Seconds() }

// Load runs cfg.Runs programs from cfg.Clients concurrent clients, each
// waiting for its run before starting the next. Client i works in
// conversation i mod cfg.Conversations; with more conversations than
// clients, run n goes to conversation n mod cfg.Conversations; with
// NewEach, every run to a new one.
func Load(ctx context.Context, c Client, cfg LoadConfig) (LoadResult, error) {
	sessions := make([]*mcp.ClientSession, cfg.Clients)
	for i := range sessions {
		cs, err := c.Session(ctx, nil)
		if err != nil {
			return LoadResult{}, fmt.Errorf("connect client %d: %w", i, err)
		}
		sessions[i] = cs
		defer cs.Close()
	}
	var (
		next       atomic.Int64
		mu         sync.Mutex
		latencies  []time.Duration
		errors     int
		firstError string
		wg         sync.WaitGroup
	)
	start := time.Now()
	for i, cs := range sessions {
		wg.Go(func() {
			for {
				n := next.Add(1)
				if n > int64(cfg.Runs) {
					return
				}
				args := map[string]any{"language": cfg.Language, "code": cfg.Code}
				switch conv := max(cfg.Conversations, 1); {
				case cfg.NewEach:
				case conv > cfg.Clients:
					args["conversationId"] = fmt.Sprintf("%s-%d", cfg.Prefix, int(n)%conv)
				default:
					args["conversationId"] = fmt.Sprintf("%s-%d", cfg.Prefix, i%conv)
				}
				t := time.Now()
				_, err := RunCode(ctx, cs, args, nil)
				d := time.Since(t)
				mu.Lock()
				if err != nil {
					errors++
					if firstError == "" {
						firstError = err.Error()
					}
				} else {
					latencies = append(latencies, d)
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	return LoadResult{Runs: cfg.Runs, Errors: errors, FirstError: firstError, Elapsed: time.Since(start), Latency: Summarize(latencies)}, nil
}
