// Package bench measures a running service from the outside, as clients
// see it: latency of sequential runs over MCP, throughput under concurrent
// clients, when the first line of output reaches the client, and the
// baselines (plain Docker) each figure is compared with. cmd/loadgen and
// cmd/bench are thin mains over it.
package bench

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// Client connects to a service.
type Client struct {
	URL   string // base URL, e.g. http://localhost:8080
	Token string
}

// httpClient keeps enough idle connections for many concurrent sessions.
var httpTransport = &http.Transport{MaxIdleConnsPerHost: 256, MaxConnsPerHost: 0}

// Session opens an MCP session over Streamable HTTP. onProgress, if not
// nil, receives progress notifications.
func (c Client) Session(ctx context.Context, onProgress func(token any, msg string)) (*mcp.ClientSession, error) {
	opts := &mcp.ClientOptions{}
	if onProgress != nil {
		opts.ProgressNotificationHandler = func(_ context.Context, r *mcp.ProgressNotificationClientRequest) {
			onProgress(r.Params.ProgressToken, r.Params.Message)
		}
	}
	cl := mcp.NewClient(&mcp.Implementation{Name: "runbox-bench", Version: "1"}, opts)
	return cl.Connect(ctx, &mcp.StreamableClientTransport{
		Endpoint:             c.URL + "/mcp",
		HTTPClient:           &http.Client{Transport: authTransport{token: c.Token}},
		DisableStandaloneSSE: true,
	}, nil)
}

type authTransport struct{ token string }

func (a authTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+a.token)
	return httpTransport.RoundTrip(r)
}

// Result is the part of a RunResult the bench reads.
type Result struct {
	Success bool   `json:"success"`
	Stdout  string `json:"stdout"`
	Stderr  string `json:"stderr"`
	RunID   string `json:"run_id"`
	Error   string `json:"error"`
}

// RunCode calls run_code and returns the result.
func RunCode(ctx context.Context, cs *mcp.ClientSession, args map[string]any, progressToken any) (Result, error) {
	params := &mcp.CallToolParams{Name: "run_code", Arguments: args}
	if progressToken != nil {
		params.SetProgressToken(progressToken)
	}
	res, err := cs.CallTool(ctx, params)
	if err != nil {
		return Result{}, err
	}
	b, _ := json.Marshal(res.StructuredContent)
	if res.IsError {
		return Result{}, fmt.Errorf("run_code: %s", b)
	}
	var r Result
	if err := json.Unmarshal(b, &r); err != nil {
		return Result{}, err
	}
	if !r.Success {
		return r, fmt.Errorf("run failed: %s%s", r.Error, r.Stderr)
	}
	return r, nil
}

// Upload puts a file into a conversation.
func Upload(ctx context.Context, cs *mcp.ClientSession, cid, name string, data []byte) error {
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "upload_file", Arguments: map[string]any{
		"conversationId": cid, "filename": name, "content_base64": base64.StdEncoding.EncodeToString(data), "overwrite": true,
	}})
	if err != nil {
		return err
	}
	if res.IsError {
		b, _ := json.Marshal(res.StructuredContent)
		return fmt.Errorf("upload_file: %s", b)
	}
	return nil
}

// Fork forks a conversation once (fork_conversation) and returns the
// fork's id.
func Fork(ctx context.Context, cs *mcp.ClientSession, cid string) (string, error) {
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "fork_conversation", Arguments: map[string]any{"conversationId": cid}})
	if err != nil {
		return "", err
	}
	b, _ := json.Marshal(res.StructuredContent)
	var out struct {
		Conversations []struct {
			ConversationID string `json:"conversationId"`
		} `json:"conversations"`
	}
	if res.IsError || json.Unmarshal(b, &out) != nil || len(out.Conversations) != 1 {
		return "", fmt.Errorf("fork_conversation: %s", b)
	}
	return out.Conversations[0].ConversationID, nil
}

// Event is the part of a run event the bench reads.
type Event struct {
	Seq  int64     `json:"seq"`
	TS   time.Time `json:"ts"`
	Type string    `json:"type"`
}

// Events returns a finished run's events.
func Events(ctx context.Context, cs *mcp.ClientSession, runID string) ([]Event, error) {
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "get_run", Arguments: map[string]any{"run_id": runID}})
	if err != nil {
		return nil, err
	}
	b, _ := json.Marshal(res.StructuredContent)
	var p struct {
		Events []Event `json:"events"`
	}
	if err := json.Unmarshal(b, &p); err != nil {
		return nil, err
	}
	return p.Events, nil
}

// QueueDelay is how long a run waited between its queued and started
// events.
func QueueDelay(evs []Event) (time.Duration, error) {
	var queued, started time.Time
	for _, ev := range evs {
		switch ev.Type {
		case "queued":
			queued = ev.TS
		case "started":
			started = ev.TS
		}
	}
	if queued.IsZero() || started.IsZero() {
		return 0, errors.New("run has no queued or started event")
	}
	return started.Sub(queued), nil
}

// Stats summarises durations.
type Stats struct {
	N                int
	Median, P90, P99 time.Duration
	Min, Max         time.Duration
}

// Summarize computes Stats of samples.
func Summarize(samples []time.Duration) Stats {
	if len(samples) == 0 {
		return Stats{}
	}
	s := slices.Clone(samples)
	slices.Sort(s)
	at := func(q float64) time.Duration { return s[min(len(s)-1, int(q*float64(len(s))))] }
	return Stats{N: len(s), Median: at(0.5), P90: at(0.9), P99: at(0.99), Min: s[0], Max: s[len(s)-1]}
}

// Sequential runs code n times, one after the other, in conversation cid
// (after warmup runs that are not measured), and returns each run's
// latency and queue delay.
func Sequential(ctx context.Context, cs *mcp.ClientSession, cid, language, code string, warmup, n int) (latency, queue []time.Duration, err error) {
	return SequentialArgs(ctx, cs, map[string]any{"language": language, "code": code, "conversationId": cid}, warmup, n)
}

// SequentialArgs is Sequential with run_code's arguments given whole.
func SequentialArgs(ctx context.Context, cs *mcp.ClientSession, args map[string]any, warmup, n int) (latency, queue []time.Duration, err error) {
	for range warmup {
		if _, err := RunCode(ctx, cs, args, nil); err != nil {
			return nil, nil, err
		}
	}
	for range n {
		start := time.Now()
		r, err := RunCode(ctx, cs, args, nil)
		if err != nil {
			return nil, nil, err
		}
		latency = append(latency, time.Since(start))
		evs, err := Events(ctx, cs, r.RunID)
		if err != nil {
			return nil, nil, err
		}
		d, err := QueueDelay(evs)
		if err != nil {
			return nil, nil, err
		}
		queue = append(queue, d)
	}
	return latency, queue, nil
}

// Paced runs code n times in conversation cid as Sequential does, but
// with a pause after each run, as a client that reads each result before
// its next call runs them, and returns each run's latency. Back to back, a run can find
// its sandbox still making ready for it (under gVisor a run's housekeeping
// — its process's exit, the next one's fork — outlasts a client's round
// trip); paced, it finds the sandbox ready.
func Paced(ctx context.Context, cs *mcp.ClientSession, cid, language, code string, pause time.Duration, warmup, n int) ([]time.Duration, error) {
	args := map[string]any{"language": language, "code": code, "conversationId": cid}
	var latency []time.Duration
	for i := range warmup + n {
		start := time.Now()
		if _, err := RunCode(ctx, cs, args, nil); err != nil {
			return nil, err
		}
		if i >= warmup {
			latency = append(latency, time.Since(start))
		}
		select {
		case <-time.After(pause):
		case <-ctx.Done():
			return nil, ctx.Err()
		}
	}
	return latency, nil
}

// FirstOutput measures how long after a program prints its first line the
// client receives it as a progress notification: the program prints the
// time, then lingers.
func FirstOutput(ctx context.Context, c Client, cid string, n int) ([]time.Duration, error) {
	var mu sync.Mutex
	got := map[any]time.Duration{} // by progress token: receipt minus print
	cs, err := c.Session(ctx, func(token any, msg string) {
		now := time.Now()
		mu.Lock()
		defer mu.Unlock()
		if _, ok := got[token]; !ok {
			var printed float64
			if _, err := fmt.Sscan(msg, &printed); err == nil {
				got[token] = now.Sub(time.Unix(0, int64(printed*1e9)))
			}
		}
	})
	if err != nil {
		return nil, err
	}
	defer cs.Close()
	code := "import time\nprint(repr(time.time()), flush=True)\ntime.sleep(0.2)"
	args := map[string]any{"language": "python", "code": code, "conversationId": cid}
	if _, err := RunCode(ctx, cs, args, nil); err != nil { // warm the sandbox
		return nil, err
	}
	var out []time.Duration
	for i := range n {
		token := fmt.Sprintf("first-%d", i)
		if _, err := RunCode(ctx, cs, args, token); err != nil {
			return nil, err
		}
		// Notifications may be handled just after the result.
		deadline := time.Now().Add(2 * time.Second)
		for {
			mu.Lock()
			d, ok := got[token]
			mu.Unlock()
			if ok {
				out = append(out, d)
				break
			}
			if time.Now().After(deadline) {
				return nil, fmt.Errorf("no progress notification for run %d", i)
			}
			time.Sleep(time.Millisecond)
		}
	}
	return out, nil
}

// AffinityResult is how often a conversation's runs found the sandbox its
// previous run ran in.
type AffinityResult struct {
	Runs, Hits int // runs after each conversation's first; those in the same sandbox
	// MaxSandboxes is the most sandboxes one conversation ran in.
	MaxSandboxes int
}

// Affinity runs perConv runs in each of convs conversations, in turn, one
// at a time, each printing the hostname of its sandbox.
func Affinity(ctx context.Context, cs *mcp.ClientSession, prefix string, convs, perConv int) (AffinityResult, error) {
	var res AffinityResult
	last := make([]string, convs)
	seen := make([]map[string]bool, convs)
	for i := range perConv {
		for c := range convs {
			r, err := RunCode(ctx, cs, map[string]any{"language": "python", "conversationId": fmt.Sprintf("%s-%d", prefix, c),
				"code": "import socket\nprint(socket.gethostname())"}, nil)
			if err != nil {
				return res, err
			}
			host := strings.TrimSpace(r.Stdout)
			if seen[c] == nil {
				seen[c] = map[string]bool{}
			}
			seen[c][host] = true
			res.MaxSandboxes = max(res.MaxSandboxes, len(seen[c]))
			if i > 0 {
				res.Runs++
				if host == last[c] {
					res.Hits++
				}
			}
			last[c] = host
		}
	}
	return res, nil
}
