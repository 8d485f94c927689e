package main

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/runbox-dev/runbox/internal/bench"
)

// Burst is issue 36's tail of new conversations: burstClients clients at
// once, each run_code print(1) in a new conversation, burstRuns runs.
const (
	burstRuns    = 100
	burstClients = 8
	burstTarget  = 250 * time.Millisecond
)

// burst measures a burst of new conversations — what a pool that runs
// dry turns into cold starts — and then the executor's idle CPU once its
// pool has refilled.
func (s *suite) burst(ctx context.Context) ([]row, error) {
	s.svc.settle()
	log.Printf("burst: %d print(1) runs, %d clients at once, each run a new conversation", burstRuns, burstClients)
	r, err := bench.Load(ctx, s.client, bench.LoadConfig{Runs: burstRuns, Clients: burstClients, Language: "python",
		Code: "print(1)", NewEach: true})
	if err != nil {
		return nil, err
	}
	l := r.Latency
	rows := []row{{
		measure: fmt.Sprintf("burst: %d `run_code` `print(1)`, %d clients at once, each run a new conversation",
			burstRuns, burstClients),
		result: fmt.Sprintf("p50 %s, p90 %s, p99 %s (%.1f runs/s, %d errors)", ms(l.Median), ms(l.P90), ms(l.P99),
			r.Throughput(), r.Errors),
		baseline: "—",
		ratio:    "—",
		target:   "p99 ≤ " + ms(burstTarget),
		met:      r.Errors == 0 && l.P99 <= burstTarget,
	}}

	log.Print("idle: the executor with its pool refilled, 20 s")
	s.svc.settle()
	idle := s.svc.cpuOf(20*time.Second, "executor-0")
	return append(rows, idleRow("idle CPU of the executor with its pool refilled after the burst, 20 s", idle)), nil
}

// onlyBurst measures the burst's rows on a service of its own.
func onlyBurst(ctx context.Context, binDir string, n int) ([]row, error) {
	return onService(ctx, binDir, func(svc *service, cs *mcp.ClientSession) ([]row, error) {
		client := bench.Client{URL: svc.url, Token: svc.token}
		return (&suite{svc: svc, client: client, cs: cs, n: n}).burst(ctx)
	})
}
