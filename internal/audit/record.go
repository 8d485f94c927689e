package audit

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"log/slog"
	"time"
	"unicode/utf8"

	"github.com/jonboulle/clockwork"

	"github.com/runbox-dev/runbox"
	"github.com/runbox-dev/runbox/internal/store"
)

// Recorder writes a call's entries: its start before it executes, its
// end with the outcome.
type Recorder struct {
	store *store.Store
	clock clockwork.Clock
	log   *slog.Logger
}

// NewRecorder returns a Recorder.
func NewRecorder(st *store.Store, clock clockwork.Clock, log *slog.Logger) *Recorder {
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

// Denied records a request refused for want of a valid token: it never
// started, so both its entries are written at once.
func (r *Recorder) Denied(ctx context.Context, route string) {
	c, err := r.Begin(ctx, Entry{Route: route})
	if err == nil {
		c.End(ctx, "unauthorized", "")
	}
}

func (r *Recorder) append(ctx context.Context, e Entry) error {
	b, err := json.Marshal(e)
	if err != nil {
		return err
	}
	return r.store.AuditAppend(ctx, b)
}

// bulk are the arguments recorded as their length and SHA-256 only.
var bulk = map[string]bool{"code": true, "data": true, "content_base64": true, "stdin": true, "content": true}

// maxParamString bounds the text of any other argument recorded;
// maxParamItems the entries of a list of paths or files.
const (
	maxParamString = 256
	maxParamItems  = 32
)

// Sanitize returns a call's arguments as the log keeps them: bulk fields
// (code, input data, file content) and env values as {len, sha256}, other
// text cut to 256 bytes, nested values as their size. Files sent to be
// written somewhere ("files": [{path, content}] or {path: content}) are
// kept as their paths with each content's {len, sha256}; "paths" (a list
// of file names) as the names. A token is never an argument: tokens travel
// in headers, which are not recorded.
func Sanitize(args map[string]any) map[string]any {
	if len(args) == 0 {
		return nil
	}
	out := make(map[string]any, len(args))
	for k, v := range args {
		k = cut(k)
		switch {
		case bulk[k]:
			out[k] = digest(v)
		case k == "files":
			out[k] = fileList(v)
		case k == "paths":
			out[k] = pathList(v)
		case k == "env":
			env, ok := v.(map[string]any)
			if !ok {
				out[k] = digest(v)
				continue
			}
			d := make(map[string]any, len(env))
			for name, val := range env {
				d[cut(name)] = digest(val)
			}
			out[k] = d
		default:
			switch val := v.(type) {
			case string:
				out[k] = cut(val)
			case float64, bool, nil, json.Number:
				out[k] = val
			default:
				b, _ := json.Marshal(val)
				out[k] = map[string]any{"len": len(b)}
			}
		}
	}
	return out
}

// fileList records files to be written: each path, and its content as
// {len, sha256}; every other field of an entry is digested too, but for
// its encoding.
func fileList(v any) any {
	var out []map[string]any
	add := func(m map[string]any) bool {
		if len(out) == maxParamItems {
			return false
		}
		e := map[string]any{}
		for k, val := range m {
			switch s, ok := val.(string); {
			case ok && (k == "path" || k == "encoding"):
				e[cut(k)] = cut(s)
			default:
				e[cut(k)] = digest(val)
			}
		}
		out = append(out, e)
		return true
	}
	switch files := v.(type) {
	case []any:
		for _, f := range files {
			m, ok := f.(map[string]any)
			if !ok {
				m = map[string]any{"content": f}
			}
			if !add(m) {
				break
			}
		}
		return map[string]any{"count": len(files), "files": out}
	case map[string]any:
		for p, content := range files {
			if !add(map[string]any{"path": p, "content": content}) {
				break
			}
		}
		return map[string]any{"count": len(files), "files": out}
	}
	return digest(v)
}

// pathList records a list of file names, cut.
func pathList(v any) any {
	list, ok := v.([]any)
	if !ok {
		return digest(v)
	}
	out := []string{}
	for _, p := range list[:min(len(list), maxParamItems)] {
		s, ok := p.(string)
		if !ok {
			b, _ := json.Marshal(p)
			s = string(b)
		}
		out = append(out, cut(s))
	}
	return map[string]any{"count": len(list), "paths": out}
}

func digest(v any) map[string]any {
	s, ok := v.(string)
	if !ok {
		b, _ := json.Marshal(v)
		s = string(b)
	}
	sum := sha256.Sum256([]byte(s))
	return map[string]any{"len": len(s), "sha256": hex.EncodeToString(sum[:])}
}

func cut(s string) string {
	if len(s) <= maxParamString {
		return s
	}
	s = s[:maxParamString]
	for !utf8.ValidString(s) {
		s = s[:len(s)-1]
	}
	return fmt.Sprintf("%s…", s)
}
