// Package interp is E2B's code interpreter (a sandbox's port 49999) on
// runbox's runs: POST /execute answers newline-delimited JSON — stdout
// and stderr as they come, the cell's results (its last expression, in
// every format it has, and matplotlib's figures), its error by name,
// value and traceback, its count — and /contexts makes, lists, restarts
// and removes contexts.
//
// A Python cell is a kept-state run of the sandbox's conversation: the
// conversation's kept interpreter holds what cells define, across calls,
// runbox's pause and resume, and runbox's own run_code with keep_state
// on the same conversation (the default context is that interpreter's
// namespace; another context is a namespace of its own in it). A cell
// of another language is a run of that language's runner, without kept
// state.
package interp

import (
	"context"
	"crypto/rand"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"slices"
	"strings"

	"github.com/runbox-dev/runbox"
)

//go:embed cell.py
var cellHelper string

// Runs runs cells (*runs.Service).
type Runs interface {
	Submit(ctx context.Context, spec runbox.Spec, idempotencyKey string) (runbox.Run, error)
	Follow(ctx context.Context, run runbox.Run, onEvent func(runbox.Event)) (*runbox.Result, error)
	Cancel(ctx context.Context, id string) (runbox.Status, error)
}

// Contexts keeps a sandbox's contexts in its record (e2b.Service).
type Contexts interface {
	// UpdateContexts applies change to the sandbox's contexts and saves
	// what it returns.
	UpdateContexts(ctx context.Context, id string, change func([]runbox.E2BContext) ([]runbox.E2BContext, error)) ([]runbox.E2BContext, error)
}

// Bounds of the interpreter.
const (
	maxContexts = 32
	maxBody     = 1 << 20
	// home is a context's default working directory.
	home = "/home/user"
)

// languages the interpreter runs, by the names E2B's SDKs send, and
// their runners.
var languages = map[string]string{
	"python": "python", "": "python",
	"javascript": "javascript", "js": "javascript", "typescript": "typescript", "ts": "typescript",
	"bash": "shell", "sh": "shell", "r": "r", "java": "java",
}

// Interpreter serves the sandboxes' code interpreters.
type Interpreter struct {
	runs     Runs
	contexts Contexts
	log      *slog.Logger
}

// New returns an Interpreter.
func New(rs Runs, cs Contexts, log *slog.Logger) *Interpreter {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Interpreter{runs: rs, contexts: cs, log: log.With("component", "e2b-interpreter")}
}

// Serve serves a call to sb's interpreter; r's context is sb's client's.
func (in *Interpreter) Serve(w http.ResponseWriter, r *http.Request, sb runbox.E2BSandbox) {
	r.Body = http.MaxBytesReader(w, r.Body, maxBody)
	path := r.URL.Path
	id, rest, _ := strings.Cut(strings.TrimPrefix(path, "/contexts/"), "/")
	switch {
	case path == "/health" && r.Method == http.MethodGet:
		w.WriteHeader(http.StatusOK)
		_, _ = io.WriteString(w, "\"OK\"")
	case path == "/execute" && r.Method == http.MethodPost:
		in.execute(w, r, sb)
	case path == "/contexts" && r.Method == http.MethodPost:
		in.create(w, r, sb)
	case path == "/contexts" && r.Method == http.MethodGet:
		writeJSON(w, http.StatusOK, listed(sb.Contexts))
	case strings.HasPrefix(path, "/contexts/") && rest == "" && r.Method == http.MethodDelete:
		in.remove(w, r, sb, id)
	case strings.HasPrefix(path, "/contexts/") && rest == "restart" && r.Method == http.MethodPost:
		in.restart(w, r, sb, id)
	default:
		text(w, http.StatusNotFound, "not found")
	}
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// text answers as E2B's interpreter does: plain text.
func text(w http.ResponseWriter, status int, msg string) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.WriteHeader(status)
	_, _ = io.WriteString(w, msg)
}

// fail answers a runbox error with its status and message.
func fail(w http.ResponseWriter, err error) {
	status := http.StatusInternalServerError
	msg := "internal error"
	switch runbox.ErrorCode(err) {
	case runbox.EInvalid, runbox.ETooLarge, runbox.EUnknownLanguage, runbox.EUnsupported:
		status, msg = http.StatusBadRequest, runbox.ErrorMessage(err)
	case runbox.ENotFound:
		status, msg = http.StatusNotFound, runbox.ErrorMessage(err)
	case runbox.ERateLimited, runbox.EBusy, runbox.EQuotaExceeded, runbox.EMaxSessions:
		status, msg = http.StatusTooManyRequests, runbox.ErrorMessage(err)
	case runbox.EUnavailable:
		status, msg = http.StatusServiceUnavailable, runbox.ErrorMessage(err)
	}
	text(w, status, msg)
}

// contextJSON is a context as E2B's interpreter answers it.
type contextJSON struct {
	ID       string `json:"id"`
	Language string `json:"language"`
	Cwd      string `json:"cwd"`
}

// The default contexts, as E2B's interpreter has them: Python's, the kept
// interpreter's own namespace, and JavaScript's (without kept state).
var (
	defaultContext    = runbox.E2BContext{ID: "default", Language: "python", Cwd: home}
	javascriptContext = runbox.E2BContext{ID: "default-javascript", Language: "javascript", Cwd: home}
)

func listed(cs []runbox.E2BContext) []contextJSON {
	out := []contextJSON{{ID: defaultContext.ID, Language: defaultContext.Language, Cwd: defaultContext.Cwd},
		{ID: javascriptContext.ID, Language: javascriptContext.Language, Cwd: javascriptContext.Cwd}}
	for _, c := range cs {
		out = append(out, contextJSON{ID: c.ID, Language: c.Language, Cwd: c.Cwd})
	}
	return out
}

// create makes a context.
func (in *Interpreter) create(w http.ResponseWriter, r *http.Request, sb runbox.E2BSandbox) {
	var body struct {
		Language string `json:"language"`
		Cwd      string `json:"cwd"`
	}
	if err := json.NewDecoder(r.Body).Decode(&body); err != nil && !errors.Is(err, io.EOF) {
		text(w, http.StatusBadRequest, "the body is not JSON")
		return
	}
	lang := strings.ToLower(body.Language)
	if _, ok := languages[lang]; !ok {
		text(w, http.StatusBadRequest, fmt.Sprintf("language %q is not one the interpreter runs", clip(body.Language, 40)))
		return
	}
	if lang == "" {
		lang = "python"
	}
	c := runbox.E2BContext{ID: strings.ToLower(rand.Text()), Language: lang, Cwd: body.Cwd}
	if c.Cwd == "" {
		c.Cwd = home
	}
	_, err := in.contexts.UpdateContexts(r.Context(), sb.ID, func(cs []runbox.E2BContext) ([]runbox.E2BContext, error) {
		if len(cs) >= maxContexts {
			return nil, runbox.Errorf(runbox.EInvalid, "the sandbox has %d contexts, the most it may; remove one first", len(cs))
		}
		return append(cs, c), nil
	})
	if err != nil {
		fail(w, err)
		return
	}
	writeJSON(w, http.StatusOK, contextJSON{ID: c.ID, Language: c.Language, Cwd: c.Cwd})
}

// remove removes a context and forgets its namespace.
func (in *Interpreter) remove(w http.ResponseWriter, r *http.Request, sb runbox.E2BSandbox, id string) {
	c, ok := contextOf(sb, id)
	if !ok || c.ID == defaultContext.ID || c.ID == javascriptContext.ID {
		text(w, http.StatusNotFound, fmt.Sprintf("Context %s not found", clip(id, 64)))
		return
	}
	if _, err := in.contexts.UpdateContexts(r.Context(), sb.ID, func(cs []runbox.E2BContext) ([]runbox.E2BContext, error) {
		return slices.DeleteFunc(cs, func(x runbox.E2BContext) bool { return x.ID == id }), nil
	}); err != nil {
		fail(w, err)
		return
	}
	in.forget(r.Context(), sb, c)
	w.WriteHeader(http.StatusOK)
}

// restart empties a context's namespace: the default one's variables go,
// as a restarted kernel's would.
func (in *Interpreter) restart(w http.ResponseWriter, r *http.Request, sb runbox.E2BSandbox, id string) {
	c, ok := contextOf(sb, id)
	if !ok {
		text(w, http.StatusNotFound, fmt.Sprintf("Context %s not found", clip(id, 64)))
		return
	}
	in.forget(r.Context(), sb, c)
	w.WriteHeader(http.StatusOK)
}

// forget drops a Python context's namespace from the kept interpreter.
func (in *Interpreter) forget(ctx context.Context, sb runbox.E2BSandbox, c runbox.E2BContext) {
	if c.Language != "python" {
		return
	}
	code := fmt.Sprintf("globals().get('_e2b_contexts', {}).pop(%q, None)\nglobals().get('_e2b_counts', {}).pop(%q, None)\n", c.ID, c.ID)
	if c.ID == defaultContext.ID {
		code = "for __k in [k for k in globals() if not k.startswith('__')]:\n    del globals()[__k]\n"
	}
	run, err := in.runs.Submit(ctx, runbox.Spec{Language: "python", KeepState: true, Code: code, ConversationID: sb.ID}, "")
	if err == nil {
		_, err = in.runs.Follow(ctx, run, nil)
	}
	if err != nil {
		in.log.Warn("forget a context's namespace", "sandbox", sb.ID, "context", c.ID, "err", err)
	}
}

// contextOf returns a sandbox's context by id: the default one too.
func contextOf(sb runbox.E2BSandbox, id string) (runbox.E2BContext, bool) {
	switch id {
	case defaultContext.ID:
		return defaultContext, true
	case javascriptContext.ID:
		return javascriptContext, true
	}
	for _, c := range sb.Contexts {
		if c.ID == id {
			return c, true
		}
	}
	return runbox.E2BContext{}, false
}

func clip(s string, n int) string {
	if len(s) > n {
		return s[:n] + "…"
	}
	return s
}
