package main

import (
	"context"
	"encoding/json"
	"fmt"
	"log"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/runbox-dev/runbox/internal/bench"
)

// commandRows measures execute_code of `echo hi` (the commands tools:
// a shell command in the session's sandbox) beside run_code of the same
// in bash, warm and sequential, over one session.
func commandRows(ctx context.Context, cs *mcp.ClientSession, n int) ([]row, error) {
	log.Print("run_code bash echo hi, then execute_code echo hi, over /mcp, sequential, warm")
	bashLat, _, err := bench.SequentialArgs(ctx, cs, map[string]any{"language": "bash", "code": "echo hi",
		"conversationId": "bench-bash"}, 5, n)
	if err != nil {
		return nil, err
	}
	var execLat []time.Duration
	for i := range n + 5 {
		start := time.Now()
		res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "execute_code", Arguments: map[string]any{"command": "echo hi"}})
		if err != nil {
			return nil, err
		}
		d := time.Since(start)
		var out struct {
			Status   string `json:"status"`
			ExitCode *int   `json:"exit_code"`
		}
		b, _ := json.Marshal(res.StructuredContent)
		if err := json.Unmarshal(b, &out); err != nil || res.IsError || out.Status != "completed" {
			return nil, fmt.Errorf("execute_code: %s", b)
		}
		if i >= 5 {
			execLat = append(execLat, d)
		}
	}
	b, e := bench.Summarize(bashLat), bench.Summarize(execLat)
	return []row{{
		measure:  "`execute_code` `echo hi` over `/mcp`, sequential, warm",
		result:   pair(e),
		baseline: "`run_code` bash `echo hi` " + ms(b.Median),
		ratio:    ratio(e.Median, b.Median),
		target:   "≤ 1.5×",
		met:      float64(e.Median) <= 1.5*float64(b.Median),
	}}, nil
}

// onlyCommands is commandRows on a service of its own.
func onlyCommands(ctx context.Context, binDir string, n int) ([]row, error) {
	return onService(ctx, binDir, func(_ *service, cs *mcp.ClientSession) ([]row, error) {
		return commandRows(ctx, cs, n)
	})
}
