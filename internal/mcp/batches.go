package mcp

import (
	"context"

	mcpsdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/runbox-dev/runbox/internal/runs"
)

// GetBatchInput are get_batch's arguments.
type GetBatchInput struct {
	BatchID string `json:"batch_id" jsonschema:"the batch's id, from start_batch"`
	Cursor  string `json:"cursor,omitempty" jsonschema:"the next_cursor of the page before; omit for the first page"`
	Limit   int    `json:"limit,omitempty" jsonschema:"runs per page (default 100, at most 200)"`
}

// addBatchTools adds start_batch and get_batch: batches of runs for
// agents that fan out (a parameter sweep), with the shapes of
// POST /v1/batches and GET /v1/batches/{id}.
func (s *Server) addBatchTools() {
	AddTool(s, &mcpsdk.Tool{
		Name: "start_batch",
		Description: "Start many runs at once (up to 1000, each as start_run takes it) and return at once with the batch's id " +
			"and its runs' ids; follow it with get_batch. Each run gets a new conversation unless it names one. One invalid run " +
			"refuses the whole batch, naming its index (runs[i]). Runs past this client's concurrent runs wait their turn.",
	}, ToolSpec{Destructive: true, Egress: true}, s.startBatch)
	AddTool(s, &mcpsdk.Tool{
		Name: "get_batch",
		Description: "A batch's counts (total, queued, running, succeeded, failed, cancelled) and a page of its runs in the order " +
			"given, with their results once done; pass next_cursor as cursor for the next page.",
	}, ToolSpec{ReadOnly: true, Idempotent: true}, s.getBatch)
}

func (s *Server) startBatch(ctx context.Context, in runs.BatchRequest) (runs.BatchCreated, error) {
	return s.runs.SubmitBatch(ctx, in)
}

func (s *Server) getBatch(ctx context.Context, in GetBatchInput) (runs.BatchPage, error) {
	return s.runs.GetBatch(ctx, in.BatchID, in.Cursor, in.Limit)
}
