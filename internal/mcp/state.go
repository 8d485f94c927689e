package mcp

import (
	"context"

	mcpsdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/runbox-dev/runbox/internal/runs"
)

// addStateTools adds the tools that pause and resume a conversation's
// kept interpreter.
func (s *Server) addStateTools() {
	AddTool(s, &mcpsdk.Tool{
		Name: "pause_session",
		Description: "Save the state of a conversation's kept interpreter (keep_state: its variables, imports, " +
			"data frames) and let its sandbox go. The next keep_state run restores it (state_restored: true); " +
			"what could not be saved (open sockets, threads, generators) is listed in lost_variables. " +
			"Idle conversations are paused by themselves.",
	}, ToolSpec{Idempotent: true}, s.pauseSession)
	AddTool(s, &mcpsdk.Tool{
		Name: "resume_session",
		Description: "Bring a paused conversation's kept interpreter back now, rather than with its next " +
			"keep_state run (which resumes it by itself).",
	}, ToolSpec{Idempotent: true}, s.resumeSession)
}

func (s *Server) pauseSession(ctx context.Context, in ConversationInput) (runs.KeptState, error) {
	return s.runs.Pause(ctx, in.id())
}

func (s *Server) resumeSession(ctx context.Context, in ConversationInput) (runs.KeptState, error) {
	return s.runs.Resume(ctx, in.id())
}
