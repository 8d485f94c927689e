package store

import (
	"context"
	"testing"
)

// TestKeptState: a fresh interpreter loses state only when one had run
// before it; an interpreter that dies loses it, once.
func TestKeptState(t *testing.T) {
	backends(t, func(t *testing.T, s *Store) {
		ctx := context.Background()
		steps := []struct {
			name        string
			fresh, died bool
			want        bool
		}{
			{"first interpreter", true, false, false},
			{"kept", false, false, false},
			{"replaced (evicted, closed, restarted)", true, false, true},
			{"kept again", false, false, false},
			{"died with the run", false, true, true},
			{"the next one starts over", true, false, false},
		}
		for _, st := range steps {
			lost, err := s.KeptState(ctx, "conv", st.fresh, st.died)
			if err != nil || lost != st.want {
				t.Errorf("%s: lost %v, %v; want %v", st.name, lost, err, st.want)
			}
		}
		if lost, _ := s.KeptState(ctx, "other", true, false); lost {
			t.Error("another conversation's state was lost")
		}
	})
}
