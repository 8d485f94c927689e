package store

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/runbox-dev/runbox"
)

// TestSessions: a session exists from its opening to its end, is found
// idle once unused past a cutoff, and is its client's alone.
func TestSessions(t *testing.T) {
	backends(t, func(t *testing.T, s *Store) {
		ctx := context.Background()
		a := runbox.SessionRef{Client: "alice", ID: "S1"}
		if ok, err := s.TouchSession(ctx, a, time.Hour); ok || err != nil {
			t.Fatalf("touch before open = %v, %v", ok, err)
		}
		if err := s.OpenSession(ctx, a, time.Hour); err != nil {
			t.Fatal(err)
		}
		if ok, err := s.TouchSession(ctx, a, time.Hour); !ok || err != nil {
			t.Fatalf("touch = %v, %v", ok, err)
		}
		if ok, _ := s.TouchSession(ctx, runbox.SessionRef{Client: "bob", ID: "S1"}, time.Hour); ok {
			t.Fatal("another client's session of the same id exists")
		}
		if idle, _ := s.IdleSessions(ctx, time.Now().Add(-time.Minute), 10); len(idle) != 0 {
			t.Fatalf("idle before its time: %v", idle)
		}
		if idle, _ := s.IdleSessions(ctx, time.Now().Add(time.Minute), 10); len(idle) != 1 || idle[0] != a {
			t.Fatalf("idle = %v, want %v", idle, a)
		}
		if ok, err := s.EndSession(ctx, a); !ok || err != nil {
			t.Fatalf("end = %v, %v", ok, err)
		}
		if ok, _ := s.EndSession(ctx, a); ok {
			t.Fatal("ended twice")
		}
		if ok, _ := s.TouchSession(ctx, a, time.Hour); ok {
			t.Fatal("an ended session is touched")
		}
		if idle, _ := s.IdleSessions(ctx, time.Now().Add(time.Minute), 10); len(idle) != 0 {
			t.Fatalf("an ended session is idle: %v", idle)
		}
	})
}

// TestExecutionPlaces: a session's live executions are held to its
// limit and to the deployment's; an ended run, a released place and a
// reservation never filled give their place back; an execution is found
// only through its own session.
func TestExecutionPlaces(t *testing.T) {
	backends(t, func(t *testing.T, s *Store) {
		ctx := context.Background()
		a, b := runbox.SessionRef{Client: "alice", ID: "A"}, runbox.SessionRef{Client: "alice", ID: "B"}
		limits := runbox.ExecutionLimits{PerSession: 2, Total: 3}
		record := func(ref runbox.SessionRef, id string) {
			t.Helper()
			r, err := s.ReserveExecution(ctx, ref, limits)
			if err != nil {
				t.Fatalf("reserve for %s: %v", id, err)
			}
			newParallelRun(t, s, id, "conv-"+ref.ID)
			if err := s.RecordExecution(ctx, r, runbox.Execution{RunID: id, Command: "echo " + id}); err != nil {
				t.Fatal(err)
			}
		}
		refused := func(ref runbox.SessionRef, total bool) {
			t.Helper()
			_, err := s.ReserveExecution(ctx, ref, limits)
			tm, ok := errors.AsType[*runbox.ErrTooManyExecutions](err)
			if !ok || tm.Total != total {
				t.Fatalf("reserve = %v, want a refusal (total %v)", err, total)
			}
		}
		record(a, "a1")
		record(a, "a2")
		refused(a, false)
		record(b, "b1")
		refused(b, true)

		// a1 ends: a place for each.
		finish(t, s, "a1", "conv-A", runbox.StatusQueued)
		r, err := s.ReserveExecution(ctx, b, limits)
		if err != nil {
			t.Fatal(err)
		}
		refused(a, true)
		if err := s.Release(ctx, r); err != nil {
			t.Fatal(err)
		}
		record(a, "a3")

		if e, err := s.SessionExecution(ctx, a, "a2"); err != nil || e.Command != "echo a2" {
			t.Fatalf("a2 = %+v, %v", e, err)
		}
		if _, err := s.SessionExecution(ctx, b, "a2"); !errors.Is(err, runbox.ErrRunNotFound) {
			t.Fatalf("a2 through another session: %v", err)
		}
		if _, err := s.SessionExecution(ctx, runbox.SessionRef{Client: "bob", ID: "A"}, "a2"); !errors.Is(err, runbox.ErrRunNotFound) {
			t.Fatalf("a2 through another client: %v", err)
		}
		list, err := s.SessionExecutions(ctx, a, 10)
		if err != nil || len(list) != 3 || list[0].RunID != "a1" || list[2].RunID != "a3" {
			t.Fatalf("executions of a = %+v, %v", list, err)
		}

		// A reservation never filled is forgotten after pendingTTL.
		if _, err := s.EndSession(ctx, a); err != nil {
			t.Fatal(err)
		}
		finish(t, s, "a2", "conv-A", runbox.StatusQueued)
		finish(t, s, "a3", "conv-A", runbox.StatusQueued)
		c := runbox.SessionRef{Client: "alice", ID: "C"}
		for range 2 {
			if _, err := s.ReserveExecution(ctx, c, limits); err != nil {
				t.Fatal(err)
			}
		}
		refused(c, false)
		s.now = func() time.Time { return time.Now().Add(2 * pendingTTL) }
		if _, err := s.ReserveExecution(ctx, c, limits); err != nil {
			t.Fatalf("a stale reservation still holds its place: %v", err)
		}
	})
}
