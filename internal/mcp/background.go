package mcp

import (
	"context"

	"github.com/runbox-dev/runbox"
	"github.com/runbox-dev/runbox/internal/runs"
)

// runBackground is run_code with background: true. It answers once the
// program has started (its run detached) with what it printed so far and
// running: true — or, if it ended first, with its result. A caller that
// goes away before then cancels it; after, the program runs on.
func (s *Server) runBackground(ctx context.Context, in runs.Request) (runAnswer, error) {
	run, err := s.runs.Submit(ctx, in.Spec(), in.IdempotencyKey)
	if err != nil {
		return runAnswer{}, err
	}
	stop := s.cancelWhenGone(ctx, run.ID, in.IdempotencyKey != "")
	run, err = s.runs.WaitDetached(ctx, run.ID)
	stop()
	if err != nil {
		return runAnswer{}, err
	}
	res := run.Result
	if !run.Status.Final() || res == nil {
		p, err := s.runs.Poll(ctx, run.ID, 0, 0)
		if err != nil {
			return runAnswer{}, err
		}
		res = &runbox.Result{RunID: run.ID, ConversationID: run.ConversationID, Success: true, ExitCode: -1,
			Running: true, Files: []runbox.FileInfo{}, Artifacts: []runbox.FileInfo{}}
		for _, ev := range p.Events {
			switch ev.Type {
			case runbox.EventStdout:
				res.Stdout += ev.Data
			case runbox.EventStderr:
				res.Stderr += ev.Data
			}
		}
		res.Output = res.Stdout + res.Stderr
	}
	return runAnswer{Value: *res, Content: resultContent(res)}, nil
}
