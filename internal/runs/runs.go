// Package runs is what the api's edges (MCP tools, REST) call: it checks a
// request, records and enqueues the run, and follows its events to the
// result.
package runs

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"regexp"
	"slices"
	"strings"
	"time"

	"github.com/runbox-dev/runbox"
	"github.com/runbox-dev/runbox/internal/auth"
	"github.com/runbox-dev/runbox/internal/clients"
	"github.com/runbox-dev/runbox/internal/egress"
	"github.com/runbox-dev/runbox/internal/store/stream"
)

// Limits bound what a run may ask for.
type Limits struct {
	MaxCodeBytes      int
	MaxTimeoutSeconds int // also the default
	// MaxCommandTimeoutSeconds is the same for the commands tools'
	// executions (SANDBOX_TIMEOUT); MaxTimeoutSeconds if 0.
	MaxCommandTimeoutSeconds int
	// MaxSessions bounds the conversations holding a sandbox
	// (SANDBOX_MAX_SESSIONS); 0: no limit.
	MaxSessions   int
	MaxStdinBytes int // stdin given up front, and each send_stdin
	MaxWaiting    int // runs waiting per conversation
	// MaxQueuedRuns and MaxQueuedBytes bound the runs a client has
	// waiting, and the bytes they hold in Redis, for clients whose tier
	// sets no bound of its own (SANDBOX_MAX_QUEUED_PER_CLIENT,
	// SANDBOX_MAX_QUEUED_BYTES_PER_CLIENT); 0: none.
	MaxQueuedRuns  int
	MaxQueuedBytes int64
	// ClientStorage returns the bytes a client's conversations take, for
	// tiers with storage_bytes; nil: not held.
	ClientStorage func(ctx context.Context, client string) (int64, error)
	// EgressAllow is what runs of clients whose tier names no
	// egress_domains may ask to reach (SANDBOX_EGRESS_ALLOW).
	EgressAllow egress.Patterns
	// EgressReachable says whether any client may ask for egress at all.
	EgressReachable bool
	// Secrets are the operator's secrets runs may ask for, without their
	// values (the executors hold those).
	Secrets egress.Secrets
}

// Bounds of a run's environment variables.
const (
	maxEnvVars      = 64
	maxEnvValueSize = 8 << 10
)

var envNamePattern = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]{0,127}$`)

// aliases map the names clients use for a language to the runner's.
var aliases = map[string]string{
	"py": "python", "python3": "python",
	"ts": "typescript",
	"js": "javascript", "node": "javascript", "nodejs": "javascript",
	"sh":     "bash",
	"golang": "go", "rs": "rust", "c++": "cpp", "cxx": "cpp",
	"rb": "ruby", "sqlite": "sql", "sqlite3": "sql",
}

// fallbacks run a language on another runner when no executor offers its
// own: JavaScript is TypeScript without types, and ran on the TypeScript
// runner before there was a JavaScript one; "shell" was bash's alias
// before runner-shell.
var fallbacks = map[string]string{"javascript": "typescript", "shell": "bash"}

// Request is what a client sends to run a program: run_code's arguments.
type Request struct {
	Language       string            `json:"language" jsonschema:"python, javascript, typescript, bash, r, sql, go, rust, java, c, cpp, ruby or php (list_runners says which this server offers)"`
	Code           string            `json:"code" jsonschema:"the program's source code"`
	ConversationID string            `json:"conversationId,omitempty" jsonschema:"conversation whose /data the program sees; made if omitted and returned"`
	SessionID      string            `json:"session_id,omitempty" jsonschema:"another name for conversationId"`
	TimeoutSeconds int               `json:"timeout_seconds,omitempty" jsonschema:"wall-clock limit in seconds; the server's maximum if omitted"`
	Stdin          string            `json:"stdin,omitempty" jsonschema:"text fed to the program's standard input"`
	Env            map[string]string `json:"env,omitempty" jsonschema:"extra environment variables"`
	KeepState      bool              `json:"keep_state,omitempty" jsonschema:"python only: run in the conversation's kept interpreter, where variables, imports and loaded data persist between calls, and a final bare expression is shown as a notebook shows it; plt.show() saves figures to /data; the result's state_lost says when earlier state was lost"`
	IdempotencyKey string            `json:"idempotency_key,omitempty" jsonschema:"the same key within 24 hours returns the same run instead of running the code again; a keyed run goes on if the connection drops, for the retry to follow"`
	Network        *runbox.Network   `json:"network,omitempty" jsonschema:"what the program may reach outside its sandbox, over HTTP(S) through runbox's proxy (HTTP_PROXY is set for it): {allowed_domains: [...]} within this client's allowlist; without it the program has no network; the result's egress lists each connection"`
	Packages       []string          `json:"packages,omitempty" jsonschema:"python: pip requirements (requests==2.32.3); typescript: npm packages; installed into the conversation, for this and later runs and the kept interpreter, before the code runs, from the index this client's allowlist lets it reach"`
	Background     bool              `json:"background,omitempty" jsonschema:"keep the program running after the call returns (a server): the call answers once it has started, with running: true and its output so far; reach its port with get_preview_url, follow it with get_run, end it with cancel_run; it also ends when idle (no output, no preview traffic) for SANDBOX_SERVER_TTL or out of the client's run-seconds"`
	Secrets        []string          `json:"secrets,omitempty" jsonschema:"names of the operator's secrets the program's HTTPS requests to their domains carry (e.g. [\"openai\"]): the program finds a placeholder under the name upper-cased (OPENAI), never the value; runbox's proxy adds the value to the requests to the secret's domains, which the run may reach"`
	CallbackURL    string            `json:"callback_url,omitempty" jsonschema:"an https URL runbox POSTs the run's record to when it ends, signed per Standard Webhooks (webhook-id, webhook-timestamp, webhook-signature); its host must be one this client's callbacks may go to"`
}

// StartRequest is start_run's arguments and the body of POST /v1/runs.
type StartRequest struct {
	Request
	Interactive bool `json:"interactive,omitempty" jsonschema:"keep the program's stdin open for send_stdin"`
}

// Spec returns the run the request asks for.
func (r Request) Spec() runbox.Spec {
	cid := r.ConversationID
	if cid == "" {
		cid = r.SessionID
	}
	return runbox.Spec{
		Language:       r.Language,
		Code:           r.Code,
		ConversationID: cid,
		TimeoutSeconds: r.TimeoutSeconds,
		Stdin:          r.Stdin,
		Env:            r.Env,
		KeepState:      r.KeepState,
		Network:        r.Network,
		Packages:       r.Packages,
		Background:     r.Background,
		Secrets:        r.Secrets,
		CallbackURL:    r.CallbackURL,
	}
}

// Spec returns the run the request asks for.
func (r StartRequest) Spec() runbox.Spec {
	spec := r.Request.Spec()
	spec.Interactive = r.Interactive
	return spec
}

// Service submits and follows runs.
type Service struct {
	store  Store
	hub    *stream.Hub
	sched  Scheduler
	limits Limits
	log    *slog.Logger
	// Metrics, when set before use, counts each client's calls, runs and
	// refusals.
	Metrics *clients.Metrics
	// Callbacks, when set before use, checks where runs' webhooks go;
	// without it a run may not ask for one.
	Callbacks Callbacks
}

// Callbacks check where runs' webhooks go (internal/webhooks).
type Callbacks interface {
	// Callback checks url as client's callback, or with url empty and
	// fallback set, gives the client's default; zero: none.
	Callback(ctx context.Context, client, url string, fallback bool) (runbox.Callback, error)
	// Callbacks checks urls (none empty) as client's callbacks together,
	// within one bound of time; each url's callback or why it was
	// refused, in order.
	Callbacks(ctx context.Context, client string, urls []string) ([]runbox.Callback, []error)
	// Admit refuses n more webhooks of client past its bound.
	Admit(ctx context.Context, client string, n int) error
}

// Scheduler gives runs to the executors' queue (*queue.Scheduler).
type Scheduler interface {
	// Enqueue queues runs that head their conversations, their turn come.
	Enqueue(ctx context.Context, ids ...string) error
	// EnqueueSpec queues a run that heads its conversation, whose spec
	// the caller has.
	EnqueueSpec(ctx context.Context, id string, spec runbox.Spec) error
	// SharedQueue is where a batch's tasks are written
	// (store.Batches.CreateBatch); StoredTask a run's task there, as the
	// queue stores it.
	SharedQueue() runbox.TaskQueue
	StoredTask(runID string, timeout time.Duration) ([]byte, error)
}

// NewService returns a Service.
func NewService(st Store, hub *stream.Hub, sched Scheduler, limits Limits, log *slog.Logger) *Service {
	return &Service{store: st, hub: hub, sched: sched, limits: limits, log: log}
}

// Limits returns the service's limits.
func (s *Service) Limits() Limits { return s.limits }

// Runners returns the languages the live executors offer.
func (s *Service) Runners(ctx context.Context) ([]runbox.Runner, error) {
	return s.store.Runners(ctx)
}

// NewConversationID makes a conversation id for a client that sent none.
func NewConversationID() string { return "sess_" + randomHex(6) }

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b) // never fails (crypto/rand)
	return hex.EncodeToString(b)
}

// normalize checks a spec and fills in its defaults. It does not know which
// languages exist; Submit checks that.
func (s *Service) normalize(spec runbox.Spec) (runbox.Spec, error) {
	// A background program leaves its conversation's order once started.
	spec.Detach = spec.Detach || spec.Background
	spec.Language = strings.ToLower(strings.TrimSpace(spec.Language))
	if a, ok := aliases[spec.Language]; ok {
		spec.Language = a
	}
	switch {
	case spec.Language == "":
		return spec, runbox.Errorf(runbox.EInvalid, "language is required")
	case strings.TrimSpace(spec.Code) == "":
		return spec, runbox.Errorf(runbox.EInvalid, "code is empty")
	case len(spec.Code) > s.limits.MaxCodeBytes:
		return spec, runbox.Errorf(runbox.ETooLarge, "code is %d bytes; the limit is %d", len(spec.Code), s.limits.MaxCodeBytes)
	case len(spec.Stdin) > s.limits.MaxStdinBytes:
		return spec, runbox.Errorf(runbox.ETooLarge, "stdin is %d bytes; the limit is %d", len(spec.Stdin), s.limits.MaxStdinBytes)
	case spec.KeepState && spec.Language != "python":
		return spec, runbox.Errorf(runbox.EInvalid, "keep_state is for python only; %s runs every program in a fresh process", truncate(spec.Language, 40))
	case spec.KeepState && (spec.Parallel || spec.Detach):
		// The kept interpreter runs one cell at a time, in order.
		return spec, runbox.Errorf(runbox.EInvalid, "keep_state runs take their turn in the conversation")
	case spec.Filesystem != nil && !spec.Command:
		return spec, runbox.Errorf(runbox.EUnsupported, "filesystem rules are for the commands tools (execute_code)")
	case spec.TimeoutSeconds < 0 || spec.TimeoutSeconds > maxTimeout(spec, s.limits):
		return spec, runbox.Errorf(runbox.EInvalid, "timeout_seconds must be between 1 and %d", maxTimeout(spec, s.limits))
	}
	if spec.TimeoutSeconds == 0 {
		spec.TimeoutSeconds = maxTimeout(spec, s.limits)
	}
	if spec.ConversationID == "" {
		spec.ConversationID = NewConversationID()
	} else if !runbox.ValidConversationID(spec.ConversationID) {
		return spec, runbox.Errorf(runbox.EInvalid, "conversationId must be 1 to 64 letters, digits, '_' or '-'")
	}
	if err := checkEnv(spec.Env); err != nil {
		return spec, err
	}
	return spec, nil
}

func checkEnv(env map[string]string) error {
	if len(env) > maxEnvVars {
		return runbox.Errorf(runbox.EInvalid, "env has %d variables; the limit is %d", len(env), maxEnvVars)
	}
	for k, v := range env {
		switch {
		case !envNamePattern.MatchString(k):
			return runbox.Errorf(runbox.EInvalid, "env name %q is not a valid variable name", truncate(k, 40))
		case strings.HasPrefix(k, "RUNBOX_"):
			return runbox.Errorf(runbox.EInvalid, "env names starting with RUNBOX_ are reserved")
		case len(v) > maxEnvValueSize || strings.ContainsRune(v, 0):
			return runbox.Errorf(runbox.EInvalid, "env value of %s is too long or holds a NUL byte", k)
		}
	}
	return nil
}

func truncate(s string, n int) string {
	if len(s) > n {
		return s[:n] + "…"
	}
	return s
}

// Submit checks spec (admit), records the run as queued and enqueues it,
// or lets it wait behind the runs of its conversation. A non-empty
// idempotency key that the client used before returns that run instead.
func (s *Service) Submit(ctx context.Context, spec runbox.Spec, idempotencyKey string) (runbox.Run, error) {
	a, err := s.admit(ctx, spec, idempotencyKey)
	if err != nil {
		return runbox.Run{}, err
	}
	return s.enqueue(ctx, a.spec, idempotencyKey, a.callback)
}

// callback checks where a run's webhooks go: url, or with url empty and
// fallback set, the client's default.
func (s *Service) callback(ctx context.Context, url string, fallback bool) (runbox.Callback, error) {
	if s.Callbacks == nil {
		if url != "" {
			return runbox.Callback{}, runbox.Errorf(runbox.EUnavailable, "callback_url: webhooks are not served here")
		}
		return runbox.Callback{}, nil
	}
	return s.Callbacks.Callback(ctx, client(ctx), url, fallback)
}

// webhooksOf is how many webhooks a run with cb may write.
func webhooksOf(cb runbox.Callback) int {
	switch {
	case cb.URL == "":
		return 0
	case cb.Started:
		return 2
	}
	return 1
}

// admitWebhooks refuses n more webhooks of the caller past its bound.
func (s *Service) admitWebhooks(ctx context.Context, n int) error {
	if n == 0 || s.Callbacks == nil {
		return nil
	}
	return s.Callbacks.Admit(ctx, client(ctx), n)
}

// enqueue records a checked run as queued and enqueues it, or lets it
// wait behind the runs of its conversation; cb is where its webhooks go.
func (s *Service) enqueue(ctx context.Context, spec runbox.Spec, idempotencyKey string, cb runbox.Callback) (runbox.Run, error) {
	run := runbox.Run{
		ID:             "run_" + randomHex(12),
		ConversationID: spec.ConversationID,
		Language:       spec.Language,
		Status:         runbox.StatusQueued,
		Interactive:    spec.Interactive,
		CreatedAt:      time.Now().UTC(),
	}
	// Recorded (with its queued event) before it is enqueued, so that the
	// executor's started event can never come first.
	adm, id, err := s.store.CreateRun(ctx, runbox.NewRun{
		Run: run, Spec: spec, Client: auth.Client(ctx), IdempotencyKey: idempotencyKey, MaxWaiting: s.limits.MaxWaiting,
		Parallel: spec.Parallel, Callback: cb, Bounds: s.bounds(ctx),
	})
	if err != nil {
		s.limited(ctx, err)
		return runbox.Run{}, err
	}
	s.Metrics.Run(client(ctx))
	switch adm {
	case runbox.AdmitExists:
		return s.Get(ctx, id)
	case runbox.AdmitEnqueue:
		if err := s.sched.EnqueueSpec(ctx, id, spec); err != nil {
			// Recorded as its conversation's head: the sweep enqueues it.
			s.log.Warn("enqueue run; the sweep will", "run", id, "err", err)
		}
	}
	return public(run), nil
}

// checkLanguage returns the runner's language that runs lang: lang, or its
// fallback when no executor offers lang itself.
func (s *Service) checkLanguage(ctx context.Context, lang string) (string, error) {
	runners, err := s.store.Runners(ctx)
	if err != nil {
		return "", err
	}
	names := make([]string, len(runners))
	for i, r := range runners {
		names[i] = r.Language
	}
	return languageIn(names, lang)
}

// languageIn returns the language of names (those the live executors
// offer) that runs lang.
func languageIn(names []string, lang string) (string, error) {
	if len(names) == 0 {
		return "", runbox.Errorf(runbox.EUnavailable, "no executor is running; try again shortly")
	}
	switch {
	case slices.Contains(names, lang):
		return lang, nil
	case fallbacks[lang] != "" && slices.Contains(names, fallbacks[lang]):
		return fallbacks[lang], nil
	}
	return "", runbox.Errorf(runbox.EUnknownLanguage, "unknown language %q; available: %s",
		truncate(lang, 40), strings.Join(names, ", "))
}

// Get returns a run's record.
func (s *Service) Get(ctx context.Context, id string) (runbox.Run, error) {
	run, err := s.get(ctx, id)
	return public(run), err
}

// get returns the record of a run of the caller's, as stored.
func (s *Service) get(ctx context.Context, id string) (runbox.Run, error) {
	if !validRunID(id) {
		return runbox.Run{}, runbox.ErrRunNotFound
	}
	run, err := s.store.Run(ctx, id)
	if err != nil {
		return runbox.Run{}, err
	}
	if !owns(ctx, run.ConversationID) {
		return runbox.Run{}, runbox.ErrRunNotFound
	}
	return run, nil
}

// Watch follows a run's events after seq after. The caller closes it.
func (s *Service) Watch(ctx context.Context, id string, after int64) (*Watch, error) {
	if _, err := s.get(ctx, id); err != nil {
		return nil, err
	}
	return &Watch{w: s.hub.Watch(ctx, id, after)}, nil
}

// Wait follows a run to its end, handing each event after seq after to
// onEvent (which may be nil), and returns the result.
func (s *Service) Wait(ctx context.Context, id string, after int64, onEvent func(runbox.Event)) (*runbox.Result, error) {
	if _, err := s.get(ctx, id); err != nil {
		return nil, err
	}
	return s.follow(ctx, id, after, onEvent)
}

// Follow is Wait from the start for a run its caller has just submitted,
// as Submit returned it: whose it is is known, and its record is not read
// back (a round trip on every run_code).
func (s *Service) Follow(ctx context.Context, run runbox.Run, onEvent func(runbox.Event)) (*runbox.Result, error) {
	return s.follow(ctx, run.ID, 0, onEvent)
}

func (s *Service) follow(ctx context.Context, id string, after int64, onEvent func(runbox.Event)) (*runbox.Result, error) {
	w := &Watch{w: s.hub.Watch(ctx, id, after)} // the result as its client sees it
	defer w.Close()
	for {
		ev, err := w.Next(ctx)
		if err != nil {
			return nil, err
		}
		if onEvent != nil {
			onEvent(ev)
		}
		if ev.Type == runbox.EventDone {
			if ev.Result == nil {
				return nil, fmt.Errorf("run %s: done without a result", id)
			}
			return ev.Result, nil
		}
	}
}

// WaitDetached follows a run (Spec.Parallel or Spec.Detach) until it has
// detached — its program runs on, outside its conversation's order and
// holding no executor slot — or ended, and returns its record then. A run
// that keeps its slot (its executor's detached runs at their limit) is
// followed to its end.
func (s *Service) WaitDetached(ctx context.Context, id string) (runbox.Run, error) {
	w, err := s.Watch(ctx, id, 0)
	if err != nil {
		return runbox.Run{}, err
	}
	defer w.Close()
	for {
		ev, err := w.Next(ctx)
		if err != nil && !errors.Is(err, io.EOF) {
			return runbox.Run{}, err
		}
		if err != nil || ev.Type == runbox.EventDetached || ev.Type == runbox.EventDone {
			return s.Get(ctx, id)
		}
	}
}

var runIDPattern = regexp.MustCompile(`^run_[0-9a-f]{24}$`)

func validRunID(id string) bool { return runIDPattern.MatchString(id) }
