package main

import (
	"bufio"
	"context"
	"fmt"
	"log"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/runbox-dev/runbox/internal/bench"
)

// roundTripRuns is how many run_code calls the round trips are counted
// over.
const roundTripRuns = 50

// roundTrips counts the Redis round trips of run_code print(1) in a warm
// conversation: runbox_redis_round_trips_total of the api and of every
// executor, before and after roundTripRuns runs one after another, less
// what the service sends idle (heartbeats, the wait for announced runs)
// over as long, counted next.
func (s *suite) roundTrips(ctx context.Context) ([]row, error) {
	log.Print("Redis round trips per run_code print(1), warm")
	if _, _, err := bench.Sequential(ctx, s.cs, "bench-rt", "python", "print(1)", 3, 0); err != nil {
		return nil, err
	}
	before, err := s.svc.roundTrips(ctx)
	if err != nil {
		return nil, err
	}
	// run_code alone: Sequential's get_run after each run would count too.
	args := map[string]any{"language": "python", "code": "print(1)", "conversationId": "bench-rt"}
	start := time.Now()
	for range roundTripRuns {
		if _, err := bench.RunCode(ctx, s.cs, args, nil); err != nil {
			return nil, err
		}
	}
	took := time.Since(start)
	after, err := s.svc.roundTrips(ctx)
	if err != nil {
		return nil, err
	}
	select {
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-time.After(took):
	}
	idle, err := s.svc.roundTrips(ctx)
	if err != nil {
		return nil, err
	}
	runs, background := after-before, idle-after
	return []row{{
		measure: fmt.Sprintf("Redis round trips per `run_code` `print(1)`, warm (api + executors; %d runs in %s: %.0f, idle as long: %.0f)",
			roundTripRuns, took.Round(time.Millisecond), runs, background),
		result:   fmt.Sprintf("%.1f", (runs-background)/roundTripRuns),
		baseline: "—",
		ratio:    "—",
		target:   "—",
		met:      true,
	}}, nil
}

// onlyRoundTrips measures the round trips' row on a service of its own.
func onlyRoundTrips(ctx context.Context, binDir string, n int) ([]row, error) {
	return onService(ctx, binDir, func(svc *service, cs *mcp.ClientSession) ([]row, error) {
		return (&suite{svc: svc, cs: cs, n: n}).roundTrips(ctx)
	})
}

// roundTrips sums runbox_redis_round_trips_total over the api and the
// executors.
func (s *service) roundTrips(ctx context.Context) (float64, error) {
	var sum float64
	for _, u := range append([]string{s.url + "/metrics"}, s.metrics...) {
		n, err := metric(ctx, u, "runbox_redis_round_trips_total")
		if err != nil {
			return 0, err
		}
		sum += n
	}
	return sum, nil
}

// metric reads an unlabelled metric from a Prometheus text page.
func metric(ctx context.Context, url, name string) (float64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return 0, fmt.Errorf("%s: %s", url, resp.Status)
	}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), name+" "); ok {
			return strconv.ParseFloat(strings.TrimSpace(v), 64)
		}
	}
	if err := sc.Err(); err != nil {
		return 0, err
	}
	return 0, fmt.Errorf("%s: no %s", url, name)
}
