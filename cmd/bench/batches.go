package main

import (
	"context"
	"fmt"
	"log"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/runbox-dev/runbox/internal/bench"
)

// batchConversations are the conversations the batches' rows spread
// their runs over.
const batchConversations = 16

// batchRows measures runs through batches beside the same runs submitted
// one by one (POST /v1/runs from 16 clients at once), on the same
// service: runs bash programs, each submission waited on to its end.
func batchRows(ctx context.Context, svc *service, runs int) ([]row, error) {
	c := bench.Client{URL: svc.url, Token: svc.token}
	log.Printf("%d runs one by one over REST, 16 submitters, %d conversations", runs, batchConversations)
	one, err := bench.OneByOne(ctx, c, bench.SubmitConfig{Runs: runs, Conversations: batchConversations,
		Prefix: "bench-rest", Submitters: 16})
	if err != nil {
		return nil, err
	}
	log.Printf("the same %d runs in batches of 1000", runs)
	batched, err := bench.Batched(ctx, c, bench.SubmitConfig{Runs: runs, Conversations: batchConversations,
		Prefix: "bench-batch", BatchSize: 1000})
	if err != nil {
		return nil, err
	}
	return []row{{
		measure: fmt.Sprintf("%d bash `echo` runs over %d conversations through `POST /v1/batches` (batches of 1000), submitted and waited for to the end",
			runs, batchConversations),
		result:   fmt.Sprintf("%.1f runs/s, %d errors", batched.Throughput(), batched.Errors),
		baseline: fmt.Sprintf("one by one (`POST /v1/runs`, 16 at once): %.1f runs/s, %d errors", one.Throughput(), one.Errors),
		ratio:    fmt.Sprintf("%.2f×", batched.Throughput()/one.Throughput()),
		target:   "≥ one by one, 0 errors",
		met:      batched.Errors == 0 && batched.Throughput() >= one.Throughput(),
	}}, nil
}

func onlyBatches(ctx context.Context, binDir string, runs int) ([]row, error) {
	return onService(ctx, binDir, func(svc *service, _ *mcp.ClientSession) ([]row, error) {
		return batchRows(ctx, svc, runs)
	})
}
