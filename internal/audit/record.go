package audit

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"log/slog"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/runbox-dev/runbox"
)

// Recorder writes a call's entries: its start before it executes, its
// end with the outcome.
type Recorder struct {
	store Appender
	clock clockwork.Clock
	log   *slog.Logger
}

// Appender records raw entries in the log (*auditlog.Log).
type Appender interface {
	Append(ctx context.Context, entry []byte) error
}

// NewRecorder returns a Recorder.
func NewRecorder(st Appender, clock clockwork.Clock, log *slog.Logger) *Recorder {
	return &Recorder{store: st, clock: clock, log: log.With("component", "audit")}
}

// Call is a call being recorded.
type Call struct {
	r     *Recorder
	entry Entry
	start time.Time
}

// Begin records the start of a call. A call whose start cannot be
// recorded must not run: the error is the caller's to return.
func (r *Recorder) Begin(ctx context.Context, e Entry) (*Call, error) {
	e.Call, e.Phase, e.Time = rand.Text()[:16], PhaseStart, r.clock.Now().UTC()
	if err := r.append(ctx, e); err != nil {
		r.log.Error("record the start of a call", "err", err)
		return nil, runbox.Errorf(runbox.EUnavailable, "the audit log cannot be written; try again shortly")
	}
	return &Call{r: r, entry: e, start: e.Time}, nil
}

// ID names the call in the log (the entries' "call"), so that what the
// call made can point back to it (a commit's trailer).
func (c *Call) ID() string { return c.entry.Call }

// End records the call's outcome: code is its error code ("" for
// success); runID the run it made, if any.
func (c *Call) End(ctx context.Context, code, runID string) {
	e := c.entry
	e.Phase, e.Time, e.Params = PhaseEnd, c.r.clock.Now().UTC(), nil
	e.Result, e.Error = ResultOf(code), code
	if runID != "" {
		e.RunID = runID
	}
	ms := e.Time.Sub(c.start).Milliseconds()
	e.DurationMS = &ms
	if err := c.r.append(context.WithoutCancel(ctx), e); err != nil {
		c.r.log.Error("record the end of a call", "call", e.Call, "err", err)
	}
}

// Egress records a connection run runID made, or was refused, through
// the egress proxy. The executor records them as they end.
func (r *Recorder) Egress(ctx context.Context, client, conversation, runID string, e runbox.Egress) {
	result := ResultSuccess
	if !e.Allowed {
		result = ResultDenied
	}
	params := map[string]any{
		"host": e.Host, "port": e.Port, "bytes_in": e.BytesIn, "bytes_out": e.BytesOut, "allowed": e.Allowed, "reason": e.Reason,
	}
	if e.Count > 0 {
		params["count"] = e.Count // connections past the run's first ones, counted together
	}
	if len(e.Secrets) > 0 {
		params["secrets"] = e.Secrets // names, never values
	}
	entry := Entry{Call: rand.Text()[:16], Phase: PhaseEvent, Time: r.clock.Now().UTC(), Client: client, Route: "egress",
		Conversation: conversation, RunID: runID, Result: result, Params: params}
	if err := r.append(context.WithoutCancel(ctx), entry); err != nil {
		r.log.Error("record an egress connection", "run", runID, "err", err)
	}
}

// Refusal is requests refused for want of a valid token, from one
// source: the first of its window, or all of them once it ends
// (package refusals), so that a stranger's flood costs the log a bounded
// number of entries.
type Refusal struct {
	// Address is the source: an IP address, an IPv6 /64, or "" for the
	// sources past what is counted apart.
	Address string
	// Routes are the routes asked for (at most a few).
	Routes []string
	// Count is how many were refused; Limited how many of them were
	// answered 429 (the source was past its budget).
	Count, Limited int
	From, To       time.Time
}

// Refused records refused requests.
func (r *Recorder) Refused(ctx context.Context, f Refusal) {
	e := Entry{Call: rand.Text()[:16], Phase: PhaseEvent, Time: r.clock.Now().UTC(), Result: ResultDenied,
		Error: runbox.EUnauthorized, Params: map[string]any{
			"address": f.Address, "count": f.Count, "limited": f.Limited, "routes": f.Routes,
			"from": f.From.UTC().Format(time.RFC3339Nano), "to": f.To.UTC().Format(time.RFC3339Nano),
		}}
	if len(f.Routes) == 1 {
		e.Route = f.Routes[0]
	}
	if err := r.append(context.WithoutCancel(ctx), e); err != nil {
		r.log.Error("record refused requests", "address", f.Address, "count", f.Count, "err", err)
	}
}

func (r *Recorder) append(ctx context.Context, e Entry) error {
	b, err := json.Marshal(e)
	if err != nil {
		return err
	}
	return r.store.Append(ctx, b)
}
