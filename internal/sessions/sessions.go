// Package sessions keeps MCP sessions: what the commands tools scope their
// executions to. A session is its client's (tenancy holds: another
// client's session is not found), lives in Redis so that any api replica
// serves its calls, and ends on the client's word (DELETE on /mcp), when
// its transport closes (HTTP+SSE, stdio), or once idle past its TTL.
// Ending one tells the parts that hold something of it (OnEnd).
//
// Over Streamable HTTP the api serves calls statelessly and issues the
// session id itself (Mcp-Session-Id on the initialize response); a call
// without one belongs to its client's sessionless scope, which ends only
// when idle.
package sessions

import (
	"context"
	"crypto/rand"
	"log/slog"
	"regexp"
	"strings"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/runbox-dev/runbox"
	"github.com/runbox-dev/runbox/internal/auth"
	"github.com/runbox-dev/runbox/internal/clients"
)

// Ref names a session: its client's, by its id ("" for the client's
// calls outside any session).
type Ref = runbox.SessionRef

// Conversation is the conversation whose folder a session's executions
// share (/data).
func Conversation(ref Ref) string {
	if ref.ID == "" {
		return "mcp-sessionless"
	}
	return "mcp-" + ref.ID
}

// Hidden is how a session's conversation is named outside the session —
// in a webhook's body, whose receiver is in no session — in place of
// "mcp-<session id>": a session's id is what reaches its conversation,
// and the contract never tells it outside the session.
const Hidden = "mcp-session"

// Redact returns conversation id as it is told outside its session: a
// session's conversation as Hidden; the sessionless scope's and any
// other as they are.
func Redact(id string) string {
	if sid, ok := strings.CutPrefix(id, "mcp-"); ok && ValidID(sid) {
		return Hidden
	}
	return id
}

// Reaches reports whether the call of ctx may reach its client's
// conversation id. A session's conversation (Conversation) is its scope:
// only calls in that session reach it — its runs, its files, its
// previews — so that another session of the same client, which could
// otherwise list its runs and learn its id, finds nothing there (not
// found, as another client's). A call outside any session (REST, an MCP
// call without a session id) is in its client's sessionless scope. Any
// other conversation is reached from anywhere.
func Reaches(ctx context.Context, id string) bool {
	sid, ok := strings.CutPrefix(id, "mcp-")
	if !ok || (sid != "sessionless" && !ValidID(sid)) {
		return true
	}
	ref, _ := From(ctx)
	return Conversation(ref) == id
}

// idPattern is what New makes: rand.Text, 26 base32 characters.
var idPattern = regexp.MustCompile(`^[A-Z2-7]{26}$`)

// ValidID reports whether id could have been issued here; a header that
// is not such an id is not looked up.
func ValidID(id string) bool { return idPattern.MatchString(id) }

type refKey struct{}

// With returns ctx carrying the session its call came in.
func With(ctx context.Context, ref Ref) context.Context {
	return context.WithValue(ctx, refKey{}, ref)
}

// From returns the session of ctx, if one was set.
func From(ctx context.Context) (Ref, bool) {
	ref, ok := ctx.Value(refKey{}).(Ref)
	return ref, ok
}

// Store keeps the sessions (store.Sessions).
type Store interface {
	OpenSession(ctx context.Context, ref Ref, ttl time.Duration) error
	TouchSession(ctx context.Context, ref Ref, ttl time.Duration) (bool, error)
	EndSession(ctx context.Context, ref Ref) (bool, error)
	EndIdleSession(ctx context.Context, ref Ref, cutoff time.Time) (bool, error)
	SessionOpen(ctx context.Context, ref Ref) (bool, error)
	SessionEnded(ctx context.Context, ref Ref) error
	EndingSessions(ctx context.Context, cutoff time.Time, n int) ([]Ref, error)
	IdleSessions(ctx context.Context, cutoff time.Time, n int) ([]Ref, error)
}

// Service opens, touches and ends sessions.
type Service struct {
	store Store
	ttl   time.Duration
	clock clockwork.Clock
	log   *slog.Logger
	onEnd []func(context.Context, Ref) error
}

// New returns a Service whose sessions end once idle for ttl.
func New(st Store, ttl time.Duration, clock clockwork.Clock, log *slog.Logger) *Service {
	return &Service{store: st, ttl: ttl, clock: clock, log: log.With("component", "sessions")}
}

// OnEnd adds f to what runs when a session ends, with a context whose
// client and session are the session's. Call it before the service is used. An error
// (or a process that stops before f returns) has f called again later,
// by the janitor: f must not mind being called twice.
func (s *Service) OnEnd(f func(context.Context, Ref) error) { s.onEnd = append(s.onEnd, f) }

// Open records a new session of the client of ctx.
func (s *Service) Open(ctx context.Context) (Ref, error) {
	ref := Ref{Client: Client(ctx), ID: rand.Text()}
	if err := s.store.OpenSession(ctx, ref, s.ttl); err != nil {
		return Ref{}, err
	}
	return ref, nil
}

// Touch marks a session used and reports whether it is open.
func (s *Service) Touch(ctx context.Context, ref Ref) (bool, error) {
	if ref.ID != "" && !ValidID(ref.ID) {
		return false, nil
	}
	return s.store.TouchSession(ctx, ref, s.ttl)
}

// Ensure marks a session used, opening it if it is not: the sessionless
// scope, and sessions whose transport the process holds (their end is
// seen when it closes), open at their first use.
func (s *Service) Ensure(ctx context.Context, ref Ref) error {
	ok, err := s.store.TouchSession(ctx, ref, s.ttl)
	if err != nil || ok {
		return err
	}
	return s.store.OpenSession(ctx, ref, s.ttl)
}

// End ends a session: it is forgotten, then what holds something of it
// lets go. It reports whether the session was open; a session ended
// twice (its transport closing as its process stops) lets go once.
func (s *Service) End(ctx context.Context, ref Ref) (bool, error) {
	ok, err := s.store.EndSession(ctx, ref)
	if err != nil || !ok {
		return false, err
	}
	s.letGo(ctx, ref)
	return true, nil
}

// letGo runs what a session's end asks for; once all of it has, the
// session is no longer ending.
func (s *Service) letGo(ctx context.Context, ref Ref) {
	ctx = With(auth.WithClient(ctx, clients.Client{Name: ref.Client}), ref)
	var failed error
	for _, f := range s.onEnd {
		if err := f(ctx, ref); err != nil {
			failed = err
		}
	}
	if failed != nil {
		s.log.Warn("an ended session's holders did not all let go; the janitor tries again", "client", ref.Client,
			"session", ref.ID, "err", failed)
		return
	}
	if err := s.store.SessionEnded(ctx, ref); err != nil {
		s.log.Warn("record a session's end", "client", ref.Client, "session", ref.ID, "err", err)
	}
	s.log.Info("session ended", "client", ref.Client, "session", ref.ID)
}

// endRetry is how long an ended session's holders are given to let go
// before the janitor tries again.
const endRetry = 2 * time.Minute

// retryEnds runs again what the ends of up to n sessions asked for, where
// it failed or its process stopped before it was done.
func (s *Service) retryEnds(ctx context.Context, n int) {
	ending, err := s.store.EndingSessions(ctx, s.clock.Now().Add(-endRetry), n)
	if err != nil {
		s.log.Warn("list ending sessions", "err", err)
		return
	}
	for _, ref := range ending {
		// One opened again since (the sessionless scope, at its client's
		// next call) is in use: what it holds is not let go.
		open, err := s.store.SessionOpen(ctx, ref)
		if err == nil && open {
			err = s.store.SessionEnded(ctx, ref)
		}
		switch {
		case err != nil:
			s.log.Warn("look at an ending session", "client", ref.Client, "session", ref.ID, "err", err)
		case !open:
			s.letGo(ctx, ref)
		}
	}
}

// EndIdle ends up to n sessions idle past the TTL and returns how many
// it ended. Ending one can take a while (its runs are cancelled, its
// folders removed): a session used after the list was read is left open.
// It also finishes the ends of sessions whose holders had not let go.
func (s *Service) EndIdle(ctx context.Context, n int) int {
	s.retryEnds(ctx, n)
	cutoff := s.clock.Now().Add(-s.ttl)
	idle, err := s.store.IdleSessions(ctx, cutoff, n)
	if err != nil {
		s.log.Warn("list idle sessions", "err", err)
		return 0
	}
	ended := 0
	for _, ref := range idle {
		ok, err := s.store.EndIdleSession(ctx, ref, cutoff)
		if err != nil {
			s.log.Warn("end an idle session", "client", ref.Client, "session", ref.ID, "err", err)
			continue
		}
		if ok {
			s.letGo(ctx, ref)
			ended++
		}
	}
	return ended
}

// Client is the client of ctx: its token's, or the default client
// (stdio).
func Client(ctx context.Context) string {
	if c := auth.Client(ctx); c != "" {
		return c
	}
	return runbox.DefaultClient
}
