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

// pauseFrame is the kept state the pause and resume rows save and bring
// back: a 100 MB DataFrame.
const pauseFrame = "import numpy as np, pandas as pd\n" +
	"df = pd.DataFrame(np.arange(100 * 2**20 // 8, dtype='int64').reshape(-1, 8))\nlen(df)"

// pauseResume measures pause_session and resume_session of a kept
// interpreter holding a 100 MB DataFrame, end to end over /mcp.
func (s *suite) pauseResume(ctx context.Context) ([]row, error) {
	log.Print("pause_session / resume_session of a 100 MB DataFrame")
	cid := "bench-pause"
	if _, err := bench.RunCode(ctx, s.cs, map[string]any{"language": "python", "conversationId": cid,
		"keep_state": true, "code": pauseFrame}, nil); err != nil {
		return nil, err
	}
	n := max(s.n/20, 3)
	var pauses, resumes []time.Duration
	for range n {
		for _, step := range []struct {
			tool string
			into *[]time.Duration
			ok   func(map[string]any) bool
		}{
			{"pause_session", &pauses, func(m map[string]any) bool { return m["paused"] == true }},
			{"resume_session", &resumes, func(m map[string]any) bool { return m["state_restored"] == true }},
		} {
			begin := time.Now()
			out, err := callTool(ctx, s.cs, step.tool, cid)
			if err != nil {
				return nil, err
			}
			if !step.ok(out) {
				return nil, fmt.Errorf("%s: %v", step.tool, out)
			}
			*step.into = append(*step.into, time.Since(begin))
		}
	}
	p, r := bench.Summarize(pauses), bench.Summarize(resumes)
	return []row{{
		measure: "`pause_session` of a kept interpreter holding a 100 MB DataFrame, over `/mcp`",
		result:  pair(p), baseline: "—", ratio: "—", target: "≤ 2 s", met: p.Median <= 2*time.Second,
	}, {
		measure: "`resume_session` of it, in a new sandbox, over `/mcp`",
		result:  pair(r), baseline: "—", ratio: "—", target: "≤ 2 s", met: r.Median <= 2*time.Second,
	}}, nil
}

// onlyPause measures pause_session and resume_session alone, on a
// service of its own.
func onlyPause(ctx context.Context, binDir string, n int) ([]row, error) {
	return onService(ctx, binDir, func(svc *service, cs *mcp.ClientSession) ([]row, error) {
		return (&suite{svc: svc, cs: cs, n: n}).pauseResume(ctx)
	})
}

// callTool calls a tool of a conversation and returns its structured
// answer.
func callTool(ctx context.Context, cs *mcp.ClientSession, tool, cid string) (map[string]any, error) {
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: tool, Arguments: map[string]any{"conversationId": cid}})
	if err != nil {
		return nil, err
	}
	b, _ := json.Marshal(res.StructuredContent)
	if res.IsError {
		return nil, fmt.Errorf("%s: %s", tool, b)
	}
	var out map[string]any
	return out, json.Unmarshal(b, &out)
}
