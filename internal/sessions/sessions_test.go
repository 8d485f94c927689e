package sessions

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/runbox-dev/runbox/internal/auth"
	"github.com/runbox-dev/runbox/internal/clients"
	"github.com/runbox-dev/runbox/internal/store"
	"github.com/runbox-dev/runbox/internal/testenv"
)

func newService(t *testing.T, clock clockwork.Clock) (*Service, *[]Ref) {
	_, url := testenv.Miniredis(t)
	st := store.New(store.NewConn(testenv.Client(t, url)))
	st.SetClock(clock.Now)
	s := New(st, time.Minute, clock, slog.New(slog.NewTextHandler(io.Discard, nil)))
	var ended []Ref
	s.OnEnd(func(ctx context.Context, ref Ref) error {
		if Client(ctx) != ref.Client {
			t.Errorf("ended with the client %q, want %q", Client(ctx), ref.Client)
		}
		ended = append(ended, ref)
		return nil
	})
	return s, &ended
}

// TestSessionLife: a session opened for its client is found, touched,
// ended once (its holders told), and not found after; an id that could
// not have been issued is never looked up.
func TestSessionLife(t *testing.T) {
	s, ended := newService(t, clockwork.NewRealClock())
	ctx := auth.WithClient(context.Background(), clients.Client{Name: "alice"})
	ref, err := s.Open(ctx)
	if err != nil || ref.Client != "alice" || !ValidID(ref.ID) {
		t.Fatalf("open: %+v, %v", ref, err)
	}
	if ok, err := s.Touch(ctx, ref); !ok || err != nil {
		t.Fatalf("touch: %v, %v", ok, err)
	}
	if ok, _ := s.Touch(ctx, Ref{Client: "bob", ID: ref.ID}); ok {
		t.Fatal("another client's session of that id is found")
	}
	if ok, _ := s.Touch(ctx, Ref{Client: "alice", ID: "../../x"}); ok {
		t.Fatal("a made-up id is found")
	}
	for range 2 {
		if _, err := s.End(ctx, ref); err != nil {
			t.Fatal(err)
		}
	}
	if len(*ended) != 1 || (*ended)[0] != ref {
		t.Fatalf("ended %v", *ended)
	}
	if ok, _ := s.Touch(ctx, ref); ok {
		t.Fatal("an ended session is found")
	}
}

// TestEndIdle: a session unused past its TTL is ended; one used since is
// not; the sessionless scope, once used, ends the same way.
func TestEndIdle(t *testing.T) {
	clock := clockwork.NewFakeClockAt(time.Now())
	s, ended := newService(t, clock)
	ctx := context.Background()
	quiet, err := s.Open(ctx)
	if err != nil {
		t.Fatal(err)
	}
	busy, _ := s.Open(ctx)
	if err := s.Ensure(ctx, Ref{Client: "default"}); err != nil {
		t.Fatal(err)
	}
	clock.Advance(45 * time.Second)
	s.Touch(ctx, busy)
	clock.Advance(30 * time.Second)
	if n := s.EndIdle(ctx, 10); n != 2 {
		t.Fatalf("ended %d, want 2 (%v)", n, *ended)
	}
	if ok, _ := s.Touch(ctx, busy); !ok {
		t.Fatal("a session in use was ended")
	}
	if ok, _ := s.Touch(ctx, quiet); ok {
		t.Fatal("an idle session lives on")
	}
}

// TestEndIdleSparesSessionUsedMeanwhile: ending an idle session takes a
// while (its runs, its folders); a session on the same list that its
// client uses meanwhile is left open.
func TestEndIdleSparesSessionUsedMeanwhile(t *testing.T) {
	clock := clockwork.NewFakeClockAt(time.Now())
	s, ended := newService(t, clock)
	ctx := context.Background()
	first, err := s.Open(ctx)
	if err != nil {
		t.Fatal(err)
	}
	clock.Advance(time.Millisecond) // listed after first
	back, _ := s.Open(ctx)
	clock.Advance(2 * time.Minute)
	s.OnEnd(func(ctx context.Context, ref Ref) error {
		if ref == first {
			s.Touch(ctx, back) // its client comes back now
		}
		return nil
	})
	if n := s.EndIdle(ctx, 10); n != 1 || len(*ended) != 1 || (*ended)[0] != first {
		t.Fatalf("ended %d: %v; want only the first", n, *ended)
	}
	if ok, _ := s.Touch(ctx, back); !ok {
		t.Fatal("a session used while the idle ones were ended was ended")
	}
}

// TestEndRetried: a session's end whose holders did not all let go (an
// error, or a process that stopped halfway) is tried again by the
// janitor, until they have; one whose scope was opened again since is
// not (what it holds is in use).
func TestEndRetried(t *testing.T) {
	clock := clockwork.NewFakeClockAt(time.Now())
	s, ended := newService(t, clock)
	ctx := context.Background()
	fail := true
	s.OnEnd(func(ctx context.Context, ref Ref) error {
		if fail {
			return errors.New("the executor could not be reached")
		}
		return nil
	})
	flaky, _ := s.Open(ctx)
	reopened := Ref{Client: "default"}
	if err := s.Ensure(ctx, reopened); err != nil {
		t.Fatal(err)
	}
	for _, ref := range []Ref{flaky, reopened} {
		if ok, err := s.End(ctx, ref); !ok || err != nil {
			t.Fatalf("end %v: %v, %v", ref, ok, err)
		}
	}
	if err := s.Ensure(ctx, reopened); err != nil { // its client's next call
		t.Fatal(err)
	}
	fail = false
	s.EndIdle(ctx, 10) // too soon: the first try may still be under way
	if len(*ended) != 2 {
		t.Fatalf("retried before endRetry: %v", *ended)
	}
	clock.Advance(endRetry + time.Second)
	s.Touch(ctx, reopened) // in use: not idle either
	s.EndIdle(ctx, 10)
	if len(*ended) != 3 || (*ended)[2] != flaky {
		t.Fatalf("ended %v; want the failed end tried again, the reopened scope left", *ended)
	}
	clock.Advance(endRetry + time.Second)
	s.Touch(ctx, reopened)
	s.EndIdle(ctx, 10)
	if len(*ended) != 3 {
		t.Errorf("a finished end was tried again: %v", *ended)
	}
}

// TestRedact: a session's conversation is told outside it without the
// session's id; the sessionless scope and other conversations as they are.
func TestRedact(t *testing.T) {
	for id, want := range map[string]string{
		"mcp-ABCDEFGHIJKLMNOPQRSTUVWXYZ": Hidden,
		"mcp-sessionless":                "mcp-sessionless",
		"mcp-session":                    "mcp-session",
		"mcp-notasession":                "mcp-notasession",
		"analysis":                       "analysis",
	} {
		if got := Redact(id); got != want {
			t.Errorf("Redact(%q) = %q; want %q", id, got, want)
		}
	}
}
