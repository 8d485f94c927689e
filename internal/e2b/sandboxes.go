package e2b

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/runbox-dev/runbox"
	"github.com/runbox-dev/runbox/internal/auth"
	"github.com/runbox-dev/runbox/internal/clients"
	"github.com/runbox-dev/runbox/internal/egress"
	"github.com/runbox-dev/runbox/internal/link"
	"github.com/runbox-dev/runbox/internal/runs"
)

// Store keeps the sandboxes' records and says which executor holds a
// conversation (store.E2B and Executors: a *store.Store).
type Store interface {
	CreateE2BSandbox(ctx context.Context, sb runbox.E2BSandbox) (bool, error)
	E2BSandbox(ctx context.Context, id string) (runbox.E2BSandbox, error)
	SaveE2BSandbox(ctx context.Context, sb runbox.E2BSandbox) error
	DeleteE2BSandbox(ctx context.Context, sb runbox.E2BSandbox) error
	ClientE2BSandboxes(ctx context.Context, client string, start, n int64) ([]*runbox.E2BSandbox, bool, error)
	DueE2BSandboxes(ctx context.Context, now time.Time, n int) ([]string, error)
	LiveE2BSandboxes(ctx context.Context, now time.Time, n int64) ([]string, error)
	Owner(ctx context.Context, cid string) (string, error)
}

// Runs are runbox's runs as the sandboxes use them (*runs.Service): a
// sandbox's daemon is a background run of its conversation, its code
// interpreter's cells kept-state runs.
type Runs interface {
	Submit(ctx context.Context, spec runbox.Spec, idempotencyKey string) (runbox.Run, error)
	Watch(ctx context.Context, id string, after int64) (*runs.Watch, error)
	Get(ctx context.Context, id string) (runbox.Run, error)
	Cancel(ctx context.Context, id string) (runbox.Status, error)
	Pause(ctx context.Context, cid string) (runs.KeptState, error)
	AllowCall(ctx context.Context) error
	Allowlist(ctx context.Context) egress.Patterns
}

// Conversations close a killed sandbox's conversation: its runs end and
// its files go (*conversations.Service).
type Conversations interface {
	Close(ctx context.Context, cid string) error
}

// Limits bound the sandboxes.
type Limits struct {
	// MaxTimeout is the longest a sandbox may live: its daemon's run asks
	// for it, and the client's tier may give it less (what is left of its
	// run-seconds today).
	MaxTimeout time.Duration
	// MaxUpload bounds an upload's body (SANDBOX_MAX_UPLOAD_BYTES).
	MaxUpload int64
	// StartWait bounds how long a create (or a resume) waits for the
	// sandbox's daemon to serve.
	StartWait time.Duration
	// KeepAlive is how often the daemons of running sandboxes are reached
	// (which keeps runbox's idle watch, SANDBOX_SERVER_TTL, from ending a
	// sandbox before its timeout); 0: never.
	KeepAlive time.Duration
}

// Options are what the sandboxes are built on.
type Options struct {
	Store   Store
	Runs    Runs
	Convs   Conversations
	Link    link.Link
	Clients func(name string) (clients.Client, bool)
	// Secret is the deployment's, which tokens are derived from.
	Secret []byte
	// Domain is where a sandbox's ports are served as hosts,
	// <port>-<id>.<domain> (the previews' domain); "" for none.
	Domain string
	Limits Limits
	Clock  clockwork.Clock
	Logger *slog.Logger
}

// Service runs E2B sandboxes on runbox's conversations: their lifecycle,
// and where their daemons are.
type Service struct {
	store   Store
	runs    Runs
	convs   Conversations
	link    link.Link
	clients func(string) (clients.Client, bool)
	key     []byte
	domain  string
	limits  Limits
	clock   clockwork.Clock
	log     *slog.Logger
	targets *targets
}

// New returns a Service.
func New(o Options) *Service {
	if o.Clock == nil {
		o.Clock = clockwork.NewRealClock()
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.Limits.StartWait == 0 {
		o.Limits.StartWait = 60 * time.Second
	}
	s := &Service{store: o.Store, runs: o.Runs, convs: o.Convs, link: o.Link, clients: o.Clients, key: keyOf(o.Secret),
		domain: o.Domain, limits: o.Limits, clock: o.Clock, log: o.Logger.With("component", "e2b")}
	s.targets = newTargets(s)
	return s
}

// asClient returns ctx carrying the sandbox's client, with its tier: the
// calls a sandbox's daemon or interpreter makes are its client's.
func (s *Service) asClient(ctx context.Context, name string) context.Context {
	c, ok := s.clients(name)
	if !ok {
		c = clients.Client{Name: name}
	}
	return auth.WithClient(ctx, c)
}

// owned returns the caller's sandbox id: runbox.ErrE2BSandboxNotFound for
// another client's, as for none.
func (s *Service) owned(ctx context.Context, id string) (runbox.E2BSandbox, error) {
	if !validID(id) {
		return runbox.E2BSandbox{}, runbox.ErrE2BSandboxNotFound
	}
	sb, err := s.store.E2BSandbox(ctx, id)
	if err != nil {
		return sb, err
	}
	if sb.Client != clientOf(ctx) {
		return runbox.E2BSandbox{}, runbox.ErrE2BSandboxNotFound
	}
	return sb, nil
}

func clientOf(ctx context.Context) string {
	if c := auth.Client(ctx); c != "" {
		return c
	}
	return runbox.DefaultClient
}

// update applies change to the latest copy of a sandbox's record and
// saves it, again from a fresh copy if another save came between; it
// returns what was saved.
func (s *Service) update(ctx context.Context, id string, change func(*runbox.E2BSandbox) error) (runbox.E2BSandbox, error) {
	for attempt := 0; ; attempt++ {
		sb, err := s.store.E2BSandbox(ctx, id)
		if err != nil {
			return sb, err
		}
		if err := change(&sb); err != nil {
			return sb, err
		}
		err = s.store.SaveE2BSandbox(ctx, sb)
		if !errors.Is(err, runbox.ErrE2BConflict) || attempt == 10 {
			return sb, err
		}
	}
}

// createRequest is what a sandbox is created with, checked.
type createRequest struct {
	template template
	id       string // the template's id
	timeout  time.Duration
	sandbox  runbox.E2BSandbox
}

// Create starts a sandbox for the caller and waits until its daemon
// serves.
func (s *Service) Create(ctx context.Context, req createRequest) (runbox.E2BSandbox, error) {
	now := s.clock.Now()
	sb := req.sandbox
	sb.Client, sb.Template, sb.Language, sb.Interpreter = clientOf(ctx), req.id, req.template.language, req.template.interpreter
	sb.Salt, sb.StartedAt, sb.State = newSalt(), now, runbox.E2BRunning
	sb.Deadline = s.deadline(ctx, now, req.timeout)
	sb.EndAt = minTime(now.Add(req.timeout), sb.Deadline)
	for {
		sb.ID = newID()
		ok, err := s.store.CreateE2BSandbox(ctx, sb)
		if err != nil {
			return sb, err
		}
		if ok {
			break
		}
	}
	started, err := s.start(ctx, sb)
	if err != nil {
		s.discard(context.WithoutCancel(ctx), sb)
		return sb, err
	}
	return started, nil
}

// deadline is the latest a sandbox started now with timeout may live:
// MaxTimeout, which its daemon's run asks for. A run reserves its time
// of its client's run-seconds a day until it ends, so for a client whose
// tier bounds them the run asks for the sandbox's timeout alone (and
// later timeouts cannot take it past that).
func (s *Service) deadline(ctx context.Context, now time.Time, timeout time.Duration) time.Time {
	if auth.Tier(ctx).RunSecondsPerDay > 0 {
		return now.Add(max(timeout, time.Second))
	}
	return now.Add(s.limits.MaxTimeout)
}

// start starts a sandbox's daemon, records its run, and waits until it
// serves.
func (s *Service) start(ctx context.Context, sb runbox.E2BSandbox) (runbox.E2BSandbox, error) {
	spec := runbox.Spec{Language: sb.Language, Code: launchers[sb.Language], ConversationID: sb.ID,
		Background: true, Detach: true, TimeoutSeconds: int(sb.Deadline.Sub(s.clock.Now()) / time.Second),
		Env: daemonEnv(sb), Network: sb.Network, Secrets: sb.Secrets}
	if spec.TimeoutSeconds < 1 {
		return sb, runbox.Errorf(runbox.EInvalid, "the sandbox's time is up")
	}
	run, err := s.runs.Submit(ctx, spec, "")
	if err != nil {
		return sb, err
	}
	sb, err = s.update(ctx, sb.ID, func(sb *runbox.E2BSandbox) error {
		sb.Run = run.ID
		return nil
	})
	if err != nil {
		return sb, err
	}
	wctx, cancel := context.WithTimeout(ctx, s.limits.StartWait)
	defer cancel()
	if err := s.awaitDaemon(wctx, sb, run.ID); err != nil {
		return sb, err
	}
	return sb, nil
}

// daemonEnv is the environment of a sandbox's processes besides the
// runner's: the client's envVars, and what E2B's sandboxes say of
// themselves.
func daemonEnv(sb runbox.E2BSandbox) map[string]string {
	env := maps.Clone(sb.EnvVars)
	if env == nil {
		env = map[string]string{}
	}
	env["E2B_SANDBOX"] = "true"
	env["E2B_SANDBOX_ID"] = sb.ID
	env["E2B_TEMPLATE_ID"] = sb.Template
	return env
}

// awaitDaemon waits until a sandbox's daemon (run id) has started and
// serves: its run's started event, then its port listening. A run that
// ends first is the sandbox's failure, told with its reason.
func (s *Service) awaitDaemon(ctx context.Context, sb runbox.E2BSandbox, id string) error {
	w, err := s.runs.Watch(ctx, id, 0)
	if err != nil {
		return err
	}
	defer w.Close()
	for started := false; !started; {
		ev, err := w.Next(ctx)
		if err != nil {
			return s.startFailed(ctx, err)
		}
		switch ev.Type {
		case runbox.EventStarted, runbox.EventDetached:
			started = true
		case runbox.EventDone:
			return runbox.Errorf(runbox.EUnavailable, "the sandbox's daemon did not start: %s", describeEnd(ev.Result))
		}
	}
	for pause := 5 * time.Millisecond; ; pause = min(2*pause, 100*time.Millisecond) {
		_, err := s.targets.find(ctx, sb)
		if err == nil {
			return nil
		}
		if !errors.Is(err, link.ErrNotListening) && !errors.Is(err, link.ErrGone) && !errors.Is(err, errUnplaced) {
			return err
		}
		select {
		case <-ctx.Done():
			return s.startFailed(ctx, ctx.Err())
		case <-s.clock.After(pause):
		}
	}
}

func (s *Service) startFailed(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return runbox.Errorf(runbox.EUnavailable, "the sandbox did not start within %s; the service is busy, try again", s.limits.StartWait)
	}
	return err
}

// describeEnd says why a daemon's run ended.
func describeEnd(res *runbox.Result) string {
	switch {
	case res == nil:
		return "it ended"
	case res.Error != "":
		return res.Error
	case res.Stderr != "":
		return clip(strings.TrimSpace(res.Stderr), 500)
	}
	return fmt.Sprintf("it exited with code %d", res.ExitCode)
}

// discard removes a sandbox that never started, and its conversation.
func (s *Service) discard(ctx context.Context, sb runbox.E2BSandbox) {
	cctx := s.asClient(ctx, sb.Client)
	if err := s.convs.Close(cctx, sb.ID); err != nil && runbox.ErrorCode(err) != runbox.ENotFound {
		s.log.Warn("close a sandbox that did not start", "sandbox", sb.ID, "err", err)
	}
	if err := s.store.DeleteE2BSandbox(ctx, sb); err != nil {
		s.log.Warn("forget a sandbox that did not start", "sandbox", sb.ID, "err", err)
	}
}

// Kill ends the caller's sandbox and removes its files.
func (s *Service) Kill(ctx context.Context, id string) error {
	sb, err := s.owned(ctx, id)
	if err != nil {
		return err
	}
	return s.kill(ctx, sb)
}

func (s *Service) kill(ctx context.Context, sb runbox.E2BSandbox) error {
	s.targets.forget(sb.ID)
	if err := s.convs.Close(s.asClient(ctx, sb.Client), sb.ID); err != nil && runbox.ErrorCode(err) != runbox.ENotFound {
		return err
	}
	return s.store.DeleteE2BSandbox(ctx, sb)
}

// Get returns the caller's sandbox, as it stands: one whose daemon ended
// on its own (out of the tier's time, its executor gone) is ended now.
func (s *Service) Get(ctx context.Context, id string) (runbox.E2BSandbox, error) {
	sb, err := s.owned(ctx, id)
	if err != nil {
		return sb, err
	}
	return s.check(ctx, sb)
}

// check ends a running sandbox whose end came or whose daemon's run is
// over: it is paused (AutoPause at its end) or killed, and then not
// found. It returns the sandbox as it stands.
func (s *Service) check(ctx context.Context, sb runbox.E2BSandbox) (runbox.E2BSandbox, error) {
	if sb.State != runbox.E2BRunning {
		return sb, nil
	}
	now := s.clock.Now()
	if !now.Before(sb.EndAt) {
		return s.expire(ctx, sb)
	}
	if sb.Run == "" {
		return sb, nil // starting
	}
	run, err := s.runs.Get(s.asClient(ctx, sb.Client), sb.Run)
	if err == nil && !run.Status.Final() {
		return sb, nil
	}
	if err != nil && !errors.Is(err, runbox.ErrRunNotFound) {
		return sb, err
	}
	s.log.Info("a sandbox's daemon ended on its own; the sandbox is killed", "sandbox", sb.ID, "run", sb.Run)
	if err := s.kill(ctx, sb); err != nil {
		return sb, err
	}
	return sb, runbox.ErrE2BSandboxNotFound
}

// expire ends a sandbox whose end came: paused with AutoPause, else
// killed (and then not found).
func (s *Service) expire(ctx context.Context, sb runbox.E2BSandbox) (runbox.E2BSandbox, error) {
	if sb.AutoPause {
		return s.pause(ctx, sb)
	}
	if err := s.kill(ctx, sb); err != nil {
		return sb, err
	}
	return sb, runbox.ErrE2BSandboxNotFound
}

// Pause pauses the caller's sandbox: runbox's pause keeps what it keeps
// (the kept interpreter's state; under an engine that snapshots, the
// sandbox), then the daemon's run ends. A paused sandbox is resumed by
// Connect.
func (s *Service) Pause(ctx context.Context, id string) error {
	sb, err := s.owned(ctx, id)
	if err != nil {
		return err
	}
	if sb.State == runbox.E2BPaused {
		return runbox.Errorf(runbox.EConversationExists, "sandbox %s is already paused", id)
	}
	_, err = s.pause(ctx, sb)
	return err
}

func (s *Service) pause(ctx context.Context, sb runbox.E2BSandbox) (runbox.E2BSandbox, error) {
	cctx := s.asClient(ctx, sb.Client)
	// runbox's pause first, while the daemon's sandbox still runs: it
	// keeps what it keeps (the kept interpreter's state; the whole
	// sandbox under an engine that snapshots).
	if _, err := s.runs.Pause(cctx, sb.ID); err != nil {
		s.log.Warn("pause a sandbox's conversation", "sandbox", sb.ID, "err", err)
	}
	if sb.Run != "" {
		if _, err := s.runs.Cancel(cctx, sb.Run); err != nil && !errors.Is(err, runbox.ErrRunNotFound) {
			return sb, err
		}
	}
	s.targets.forget(sb.ID)
	ended := sb.Run
	return s.update(ctx, sb.ID, func(now *runbox.E2BSandbox) error {
		// Paused, unless another pause came first and a resume after it
		// (its daemon is another run): that one stands.
		if now.State == runbox.E2BRunning && now.Run == ended {
			now.State, now.Run = runbox.E2BPaused, ""
		}
		return nil
	})
}

// Connect returns the caller's sandbox running, resumed if it was
// paused, to live at least timeout from now (a running sandbox's end is
// never brought forward). resumed says it was paused.
func (s *Service) Connect(ctx context.Context, id string, timeout time.Duration) (sb runbox.E2BSandbox, resumed bool, err error) {
	if sb, err = s.Get(ctx, id); err != nil {
		return sb, false, err
	}
	if sb.State == runbox.E2BPaused {
		sb, err = s.resume(ctx, sb, timeout)
		return sb, true, err
	}
	sb, err = s.update(ctx, id, func(sb *runbox.E2BSandbox) error {
		sb.EndAt = minTime(maxTime(sb.EndAt, s.clock.Now().Add(timeout)), sb.Deadline)
		return nil
	})
	return sb, false, err
}

// resume starts a paused sandbox's daemon again: its files are as they
// were, its kept interpreter comes back with its next cell.
func (s *Service) resume(ctx context.Context, sb runbox.E2BSandbox, timeout time.Duration) (runbox.E2BSandbox, error) {
	now := s.clock.Now()
	cctx := s.asClient(ctx, sb.Client)
	sb, err := s.update(ctx, sb.ID, func(sb *runbox.E2BSandbox) error {
		if sb.State != runbox.E2BPaused {
			return runbox.Errorf(runbox.EConversationExists, "sandbox %s is resuming already", sb.ID)
		}
		sb.State = runbox.E2BRunning
		sb.Deadline = s.deadline(cctx, now, timeout)
		sb.EndAt = minTime(now.Add(timeout), sb.Deadline)
		return nil
	})
	if err != nil {
		return sb, err
	}
	started, err := s.start(cctx, sb)
	if err != nil {
		// Paused again, for a later try (its daemon's run, if it got one,
		// ended).
		if _, perr := s.pause(context.WithoutCancel(ctx), started); perr != nil {
			s.log.Warn("pause a sandbox that did not resume", "sandbox", sb.ID, "err", perr)
		}
		return sb, err
	}
	return started, nil
}

// SetTimeout has the caller's sandbox end timeout from now (no later
// than its deadline).
func (s *Service) SetTimeout(ctx context.Context, id string, timeout time.Duration) error {
	if _, err := s.Get(ctx, id); err != nil {
		return err
	}
	_, err := s.update(ctx, id, func(sb *runbox.E2BSandbox) error {
		sb.EndAt = minTime(s.clock.Now().Add(timeout), sb.Deadline)
		return nil
	})
	return err
}

// Query selects the caller's sandboxes to list.
type Query struct {
	Metadata map[string]string
	States   []string // none: all
	Limit    int
	Next     string
}

// maxScan bounds the sandboxes one listing reads to find its page.
const maxScan = 2000

// List returns a page of the caller's sandboxes that match q, newest
// first, and the token of the next page ("" for none).
func (s *Service) List(ctx context.Context, q Query) ([]runbox.E2BSandbox, string, error) {
	start := int64(0)
	if q.Next != "" {
		if _, err := fmt.Sscanf(q.Next, "%d", &start); err != nil || start < 0 {
			return nil, "", runbox.Errorf(runbox.EInvalid, "nextToken is not one a listing gave")
		}
	}
	limit := q.Limit
	if limit <= 0 || limit > 100 {
		limit = 100
	}
	var out []runbox.E2BSandbox
	for scanned := 0; scanned < maxScan; {
		page, more, err := s.store.ClientE2BSandboxes(ctx, clientOf(ctx), start, 100)
		if err != nil {
			return nil, "", err
		}
		for i, sb := range page {
			scanned++
			if sb == nil || !matches(*sb, q) {
				continue
			}
			if len(out) == limit {
				return out, fmt.Sprint(start + int64(i)), nil
			}
			out = append(out, *sb)
		}
		if !more {
			return out, "", nil
		}
		start += int64(len(page))
	}
	return out, fmt.Sprint(start), nil
}

// matches reports whether a sandbox is one q selects.
func matches(sb runbox.E2BSandbox, q Query) bool {
	if len(q.States) > 0 && !slices.Contains(q.States, sb.State) {
		return false
	}
	for k, v := range q.Metadata {
		if got, ok := sb.Metadata[k]; !ok || got != v {
			return false
		}
	}
	return true
}

func minTime(a, b time.Time) time.Time {
	if a.Before(b) {
		return a
	}
	return b
}

func maxTime(a, b time.Time) time.Time {
	if a.After(b) {
		return a
	}
	return b
}

func clip(s string, n int) string {
	if len(s) > n {
		return s[:n] + "…"
	}
	return s
}

func sorted(s []string) []string {
	slices.Sort(s)
	return s
}

// UpdateContexts changes a sandbox's interpreter contexts (interp's).
func (s *Service) UpdateContexts(ctx context.Context, id string, change func([]runbox.E2BContext) ([]runbox.E2BContext, error)) ([]runbox.E2BContext, error) {
	sb, err := s.update(ctx, id, func(sb *runbox.E2BSandbox) error {
		cs, err := change(slices.Clone(sb.Contexts))
		sb.Contexts = cs
		return err
	})
	return sb.Contexts, err
}
