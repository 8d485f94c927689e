package store

import (
	"context"
	"testing"
	"time"

	"github.com/runbox-dev/runbox"
)

// TestWake: announced runs are taken once each, oldest first, those for
// the executor first when asked (the executor alternates); another
// executor sees only those for every executor. Waiting with none announced
// returns "" after the wait.
func TestWake(t *testing.T) {
	backends(t, func(t *testing.T, s *Store) {
		ctx := context.Background()
		for _, w := range []struct{ id, executor string }{{"a", ""}, {"b", ""}, {"mine", "e1"}} {
			if err := s.Wake(ctx, w.id, w.executor); err != nil {
				t.Fatal(err)
			}
		}
		if got, err := s.AwaitWake(ctx, time.Second, "e2", true); err != nil || got != "a" {
			t.Errorf("another executor took %q, %v; want a", got, err)
		}
		for _, want := range []string{"mine", "b", ""} {
			got, err := s.AwaitWake(ctx, time.Second, "e1", true)
			if err != nil || got != want {
				t.Errorf("AwaitWake = %q, %v; want %q", got, err, want)
			}
		}
	})
}

// TestOwner: a conversation's owner is named while its heartbeat lasts and
// it is not draining.
func TestOwner(t *testing.T) {
	backends(t, func(t *testing.T, s *Store) {
		ctx := context.Background()
		if o, err := s.Owner(ctx, "c"); err != nil || o != "" {
			t.Fatalf("no owner yet: %q, %v", o, err)
		}
		if err := s.SetOwner(ctx, "c", "e1", time.Minute); err != nil {
			t.Fatal(err)
		}
		if o, _ := s.Owner(ctx, "c"); o != "" {
			t.Errorf("an executor without a heartbeat owns: %q", o)
		}
		if err := s.Heartbeat(ctx, runbox.ExecutorInfo{ID: "e1"}, time.Minute); err != nil {
			t.Fatal(err)
		}
		if o, _ := s.Owner(ctx, "c"); o != "e1" {
			t.Errorf("owner %q; want e1", o)
		}
		if err := s.Drain(ctx, "e1", time.Minute); err != nil {
			t.Fatal(err)
		}
		if o, _ := s.Owner(ctx, "c"); o != "" {
			t.Errorf("a draining executor owns: %q", o)
		}
		if err := s.Unregister(ctx, "e1"); err != nil {
			t.Fatal(err)
		}
		if o, _ := s.Owner(ctx, "c"); o != "" {
			t.Errorf("a gone executor owns: %q", o)
		}
	})
}
