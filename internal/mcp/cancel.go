package mcp

import (
	"context"
	"sync"
	"time"

	mcpsdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/runbox-dev/runbox"
)

// A run_code whose caller goes away is cancelled. How a caller goes away
// depends on the transport: over stdio and legacy SSE the SDK cancels the
// call's context on notifications/cancelled; over Streamable HTTP a
// client of today's protocol sends that notification in a request of its
// own, which a stateless server never matches to the call, and closes the
// call's response stream — so the HTTP request's own context, kept by
// WithCaller, says so. Neither counts while the api itself is stopping:
// its runs finish, or the executor's shutdown ends them.

// heartbeatEvery is how often a run_code with a progress token hears
// from the server while its run is queued or silent: clients reset their
// request timeout on progress (the TypeScript SDK's default is 60 s).
const heartbeatEvery = 4 * time.Second

type callerKey struct{}

// WithCaller returns ctx carrying itself as the HTTP request's context,
// for the tools to see the caller go.
func WithCaller(ctx context.Context) context.Context {
	return context.WithValue(ctx, callerKey{}, ctx)
}

// cancelWhenGone cancels run id when its caller goes, unless the api is
// stopping. A keyed run (an idempotency_key) outlives its HTTP request:
// the key says the client will come back for it — a retry with the key
// follows the same run — and a stream that dropped looks the same as one
// closed on purpose; a cancellation the SDK delivers (stdio, legacy SSE)
// still ends it, and cancel_run always does. The returned func stops
// watching.
//
// Each watch is an AfterFunc on a context the caller's going cancels:
// AfterFunc is triggered by the cancellation itself, before the handler
// can see it and return, so a handler that returns because its caller
// went cannot stop the watch in time to miss it. (A watch on a derived
// context could: that context is cancelled from a goroutine of its own.)
func (s *Server) cancelWhenGone(ctx context.Context, id string, keyed bool) func() {
	var once sync.Once
	cancelRun := func() {
		once.Do(func() {
			if s.stopping.Err() != nil {
				return
			}
			cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
			defer cancel()
			if _, err := s.runs.Cancel(cctx, id); err != nil {
				s.log.Warn("cancel the run of a caller that went away", "run", id, "err", err)
			} else {
				s.log.Info("the caller went away; run cancelled", "run", id)
			}
		})
	}
	stops := []func() bool{context.AfterFunc(ctx, cancelRun)}
	if req, ok := ctx.Value(callerKey{}).(context.Context); ok && !keyed {
		stops = append(stops, context.AfterFunc(req, cancelRun))
	}
	return func() {
		for _, stop := range stops {
			stop()
		}
	}
}

// notifier sends a call's progress: the run's output as it comes and,
// while nothing comes, a heartbeat every heartbeatEvery. Progress values
// only grow, as the protocol asks.
type notifier struct {
	s     *Server
	req   *mcpsdk.CallToolRequest
	token any
	ch    chan runbox.Event
}

// startProgress returns the event handler of a call with a progress token
// and a func that ends its notifications; nil, and a no-op, without one.
func (s *Server) startProgress(ctx context.Context, req *mcpsdk.CallToolRequest) (func(runbox.Event), func()) {
	token := req.Params.GetProgressToken()
	if token == nil || req.Session == nil {
		return nil, func() {}
	}
	n := &notifier{s: s, req: req, token: token, ch: make(chan runbox.Event, 256)}
	done := make(chan struct{})
	go func() {
		defer close(done)
		n.loop(ctx)
	}()
	// Stopping lets the loop send what it was handed before it ends.
	return func(ev runbox.Event) {
			select {
			case n.ch <- ev:
			case <-done: // the caller is gone
			}
		}, func() {
			close(n.ch)
			<-done
		}
}

func (n *notifier) loop(ctx context.Context) {
	progress := 0.0
	t := time.NewTimer(heartbeatEvery)
	defer t.Stop()
	send := func(msg string) {
		progress++
		err := n.req.Session.NotifyProgress(ctx, &mcpsdk.ProgressNotificationParams{
			ProgressToken: n.token, Progress: progress, Message: msg,
		})
		if err != nil && ctx.Err() == nil {
			n.s.log.Debug("progress notification", "err", err)
		}
		t.Reset(heartbeatEvery)
	}
	for {
		select {
		case <-ctx.Done():
			return
		case ev, ok := <-n.ch:
			if !ok {
				return
			}
			if ev.Type == runbox.EventStdout || ev.Type == runbox.EventStderr {
				send(ev.Data)
			}
		case <-t.C:
			// A heartbeat carries no text: clients show messages as output.
			send("")
		}
	}
}
