package store

import (
	"context"
	"fmt"
	"testing"
	"time"
)

// TestBeats: an executor's heartbeat expiry moves forward with each beat;
// one that never beat has none.
func TestBeats(t *testing.T) {
	backends(t, func(t *testing.T, s *Store) {
		ctx := context.Background()
		s.Heartbeat(ctx, ExecutorInfo{ID: "a"}, time.Minute)
		first, err := s.Beats(ctx, "a", "never")
		if err != nil || first["a"] == 0 || first["never"] != 0 {
			t.Fatalf("beats = %v, %v", first, err)
		}
		time.Sleep(5 * time.Millisecond)
		s.Heartbeat(ctx, ExecutorInfo{ID: "a"}, time.Minute)
		if next, err := s.Beats(ctx, "a"); err != nil || next["a"] <= first["a"] {
			t.Errorf("after a beat: %v (before %v), %v", next, first, err)
		}
	})
}

// TestExpireLeasesOf: the leases of a dead executor's runs end at once,
// those of other executors' runs stay.
func TestExpireLeasesOf(t *testing.T) {
	backends(t, func(t *testing.T, s *Store) {
		ctx := context.Background()
		for _, id := range []string{"dead-1", "dead-2", "live-1"} {
			newRun(t, s, id)
		}
		s.Claim(ctx, "dead-1", "dead", time.Hour)
		s.Claim(ctx, "dead-2", "dead", time.Hour)
		s.Claim(ctx, "live-1", "live", time.Hour)
		ids, err := s.ExpireLeasesOf(ctx, "dead")
		if err != nil || fmt.Sprint(ids) != "[dead-1 dead-2]" {
			t.Fatalf("expired = %v, %v", ids, err)
		}
		expired, err := s.ExpiredLeases(ctx, 10)
		if err != nil || fmt.Sprint(expired) != "[dead-1 dead-2]" {
			t.Errorf("expired leases = %v, %v; want the dead executor's runs", expired, err)
		}
		if ids, err := s.ExpireLeasesOf(ctx, "nobody"); err != nil || len(ids) != 0 {
			t.Errorf("an executor with no runs: %v, %v", ids, err)
		}
	})
}
