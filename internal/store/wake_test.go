package store

import (
	"context"
	"testing"
	"time"
)

// TestWake: announced runs are taken once each, oldest first; waiting with
// none announced returns "" after the wait.
func TestWake(t *testing.T) {
	backends(t, func(t *testing.T, s *Store) {
		ctx := context.Background()
		for _, id := range []string{"a", "b"} {
			if err := s.Wake(ctx, id); err != nil {
				t.Fatal(err)
			}
		}
		for _, want := range []string{"a", "b", ""} {
			got, err := s.AwaitWake(ctx, 100*time.Millisecond)
			if err != nil || got != want {
				t.Errorf("AwaitWake = %q, %v; want %q", got, err, want)
			}
		}
	})
}
