package store

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/runbox-dev/runbox"
)

// TestE2BSandboxes: a sandbox's record is created once per id, saved only
// from its latest version, listed per client newest first, taken once its
// end has come (a paused one never is), and forgotten.
func TestE2BSandboxes(t *testing.T) {
	backends(t, func(t *testing.T, s *Store) {
		ctx := context.Background()
		t0 := time.UnixMilli(1_800_000_000_000)
		mk := func(id, client string, start time.Duration) runbox.E2BSandbox {
			return runbox.E2BSandbox{ID: id, Client: client, Template: "base", State: runbox.E2BRunning,
				StartedAt: t0.Add(start), EndAt: t0.Add(start + time.Minute)}
		}
		for _, sb := range []runbox.E2BSandbox{mk("a", "alice", 0), mk("b", "alice", time.Second), mk("c", "bob", 2*time.Second)} {
			if ok, err := s.CreateE2BSandbox(ctx, sb); err != nil || !ok {
				t.Fatalf("create %s: %v %v", sb.ID, ok, err)
			}
		}
		if ok, err := s.CreateE2BSandbox(ctx, mk("a", "bob", 0)); err != nil || ok {
			t.Fatalf("a taken id: %v %v", ok, err)
		}
		a, err := s.E2BSandbox(ctx, "a")
		if err != nil || a.Client != "alice" || a.Version != 0 {
			t.Fatalf("read: %+v %v", a, err)
		}
		stale := a
		a.Metadata = map[string]string{"k": "v"}
		if err := s.SaveE2BSandbox(ctx, a); err != nil {
			t.Fatal(err)
		}
		if err := s.SaveE2BSandbox(ctx, stale); !errors.Is(err, runbox.ErrE2BConflict) {
			t.Errorf("a stale save: %v", err)
		}
		if a, _ = s.E2BSandbox(ctx, "a"); a.Version != 1 || a.Metadata["k"] != "v" {
			t.Errorf("after a save: %+v", a)
		}
		listed, more, err := s.ClientE2BSandboxes(ctx, "alice", 0, 1)
		if err != nil || !more || len(listed) != 1 || listed[0].ID != "b" {
			t.Fatalf("first page: %+v %v %v", listed, more, err)
		}
		listed, more, err = s.ClientE2BSandboxes(ctx, "alice", 1, 1)
		if err != nil || more || len(listed) != 1 || listed[0].ID != "a" {
			t.Fatalf("second page: %+v %v %v", listed, more, err)
		}
		if live, err := s.LiveE2BSandboxes(ctx, t0.Add(30*time.Second), 10); err != nil || len(live) != 3 || live[0] != "a" {
			t.Errorf("live: %v %v", live, err)
		}
		// b pauses: no end of its own any more.
		b, _ := s.E2BSandbox(ctx, "b")
		b.State = runbox.E2BPaused
		if err := s.SaveE2BSandbox(ctx, b); err != nil {
			t.Fatal(err)
		}
		due, err := s.DueE2BSandboxes(ctx, t0.Add(5*time.Minute), 10)
		if err != nil || len(due) != 2 || due[0] != "a" || due[1] != "c" {
			t.Fatalf("due: %v %v", due, err)
		}
		if due, _ := s.DueE2BSandboxes(ctx, t0.Add(5*time.Minute), 10); len(due) != 0 {
			t.Errorf("taken twice: %v", due)
		}
		// Its taker died on the way: it comes due again.
		if due, _ := s.DueE2BSandboxes(ctx, t0.Add(6*time.Minute), 10); len(due) != 2 {
			t.Errorf("not due again after the lease: %v", due)
		}
		if err := s.DeleteE2BSandbox(ctx, a); err != nil {
			t.Fatal(err)
		}
		if _, err := s.E2BSandbox(ctx, "a"); !errors.Is(err, runbox.ErrE2BSandboxNotFound) {
			t.Errorf("a deleted sandbox: %v", err)
		}
		if err := s.SaveE2BSandbox(ctx, a); !errors.Is(err, runbox.ErrE2BSandboxNotFound) {
			t.Errorf("saving a deleted sandbox: %v", err)
		}
		if listed, _, _ := s.ClientE2BSandboxes(ctx, "alice", 0, 10); len(listed) != 1 {
			t.Errorf("alice's after a delete: %+v", listed)
		}
	})
}
