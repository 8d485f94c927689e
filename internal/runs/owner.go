package runs

import (
	"context"

	"github.com/runbox-dev/runbox"
	"github.com/runbox-dev/runbox/internal/auth"
	"github.com/runbox-dev/runbox/internal/sessions"
	"github.com/runbox-dev/runbox/internal/store/stream"
)

// Runs belong to the client whose conversation they run in. Inside the
// service a conversation is named by its key (runbox.ConversationKey);
// a client sees, and names, only its own conversations by their ids.
// Another client's run is not found, never forbidden: its existence is
// not told.

// client returns the client of ctx: the token's, or "default" (stdio).
func client(ctx context.Context) string {
	if c := auth.Client(ctx); c != "" {
		return c
	}
	return runbox.DefaultClient
}

// An MCP session's conversation is reached only within that session
// (sessions.Reaches): another session of the same client finds neither
// its runs nor the conversation, as if they were another client's.

// ConversationKey returns the key of the caller's conversation id.
func ConversationKey(ctx context.Context, id string) (string, error) {
	key, err := runbox.ConversationKey(client(ctx), id)
	if err == nil && !sessions.Reaches(ctx, id) {
		return "", runbox.Errorf(runbox.ENotFound, "no conversation %s: an MCP session's conversation is reached only within that session", id)
	}
	return key, err
}

// owns reports whether the caller owns the conversation key, and may
// reach it.
func owns(ctx context.Context, key string) bool {
	c, id, ok := runbox.ParseConversationKey(key)
	return ok && c == client(ctx) && sessions.Reaches(ctx, id)
}

// conversationID is the id a client knows its conversation key by.
func conversationID(key string) string {
	if _, id, ok := runbox.ParseConversationKey(key); ok {
		return id
	}
	return key
}

// public is a run as its client sees it.
func public(run runbox.Run) runbox.Run {
	run.ConversationID = conversationID(run.ConversationID)
	run.Result = publicResult(run.Result)
	return run
}

func publicResult(r *runbox.Result) *runbox.Result {
	if r == nil {
		return nil
	}
	c := *r
	c.ConversationID = conversationID(c.ConversationID)
	return &c
}

// Watch follows a run's events, as its client sees them.
type Watch struct {
	w *stream.Watch
}

// Next returns the run's next event; after the done event, io.EOF.
func (w *Watch) Next(ctx context.Context) (runbox.Event, error) {
	ev, err := w.w.Next(ctx)
	ev.Result = publicResult(ev.Result)
	return ev, err
}

// Last returns the seq of the last event Next returned.
func (w *Watch) Last() int64 { return w.w.Last() }

// Close stops the watch.
func (w *Watch) Close() { w.w.Close() }
