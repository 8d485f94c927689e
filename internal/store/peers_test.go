package store

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/runbox-dev/runbox"
)

// TestBeats: an executor's heartbeat expiry moves forward with each beat;
// one that never beat has none.
func TestBeats(t *testing.T) {
	backends(t, func(t *testing.T, s *Store) {
		ctx := context.Background()
		s.Heartbeat(ctx, runbox.ExecutorInfo{ID: "a"}, time.Minute)
		first, err := s.Beats(ctx, "a", "never")
		if err != nil || first["a"] == 0 || first["never"] != 0 {
			t.Fatalf("beats = %v, %v", first, err)
		}
		time.Sleep(5 * time.Millisecond)
		s.Heartbeat(ctx, runbox.ExecutorInfo{ID: "a"}, time.Minute)
		if next, err := s.Beats(ctx, "a"); err != nil || next["a"] <= first["a"] {
			t.Errorf("after a beat: %v (before %v), %v", next, first, err)
		}
	})
}

// TestReleaseDead: a dead executor is unregistered and the leases of its runs
// end at once, those of other executors' runs stay; one that beat since
// it was found dead (it restarted under the same id) keeps everything.
func TestReleaseDead(t *testing.T) {
	backends(t, func(t *testing.T, s *Store) {
		ctx := context.Background()
		for _, id := range []string{"dead-1", "dead-2", "live-1", "back-1"} {
			newRun(t, s, id)
		}
		for _, ex := range []string{"dead", "live", "back"} {
			s.Heartbeat(ctx, runbox.ExecutorInfo{ID: ex}, time.Minute)
		}
		s.Claim(ctx, "dead-1", "dead", time.Hour)
		s.Claim(ctx, "dead-2", "dead", time.Hour)
		s.Claim(ctx, "live-1", "live", time.Hour)
		s.Claim(ctx, "back-1", "back", time.Hour)
		seen, err := s.Beats(ctx, "dead", "back")
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(5 * time.Millisecond)
		s.Heartbeat(ctx, runbox.ExecutorInfo{ID: "back"}, time.Minute) // restarted

		released, ids, err := s.ReleaseDead(ctx, "dead", seen["dead"])
		if err != nil || !released || fmt.Sprint(ids) != "[dead-1 dead-2]" {
			t.Fatalf("release dead = %v %v, %v", released, ids, err)
		}
		if released, ids, err := s.ReleaseDead(ctx, "back", seen["back"]); err != nil || released || len(ids) != 0 {
			t.Errorf("an executor that beat since it was seen: released %v %v, %v", released, ids, err)
		}
		expired, err := s.ExpiredLeases(ctx, 10)
		if err != nil || fmt.Sprint(expired) != "[dead-1 dead-2]" {
			t.Errorf("expired leases = %v, %v; want the dead executor's runs", expired, err)
		}
		infos, err := s.LiveExecutors(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var live []string
		for _, info := range infos {
			live = append(live, info.ID)
		}
		slices.Sort(live)
		if fmt.Sprint(live) != "[back live]" {
			t.Errorf("registered after the releases: %v", live)
		}
		if released, ids, err := s.ReleaseDead(ctx, "nobody", 0); err != nil || !released || len(ids) != 0 {
			t.Errorf("an executor with no runs: %v %v, %v", released, ids, err)
		}
	})
}
