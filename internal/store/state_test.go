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

// TestKeptGenerations: a saved snapshot's record goes to the next
// interpreter that starts, once; a save of an interpreter that another
// has followed is refused.
func TestKeptGenerations(t *testing.T) {
	backends(t, func(t *testing.T, s *Store) {
		ctx := context.Background()
		gen, rec, err := s.KeptStarted(ctx, "gens")
		if err != nil || gen != 1 || rec != nil {
			t.Fatalf("first start: %d %q %v", gen, rec, err)
		}
		if ok, err := s.KeptSaved(ctx, "gens", 1, []byte(`{"gen":1}`)); !ok || err != nil {
			t.Fatalf("save of the last interpreter: %v %v", ok, err)
		}
		// Read as often as asked, taken by no read.
		for range 2 {
			if gen, rec, err := s.KeptLast(ctx, "gens"); err != nil || gen != 1 || string(rec) != `{"gen":1}` {
				t.Fatalf("last: %d %q %v", gen, rec, err)
			}
		}
		gen, rec, err = s.KeptStarted(ctx, "gens")
		if err != nil || gen != 2 || string(rec) != `{"gen":1}` {
			t.Fatalf("second start: %d %q %v", gen, rec, err)
		}
		if _, rec, _ = s.KeptStarted(ctx, "gens"); rec != nil {
			t.Errorf("a record handed out twice: %q", rec)
		}
		if gen, rec, err := s.KeptLast(ctx, "gens"); err != nil || gen != 3 || rec != nil {
			t.Errorf("last after the record was taken: %d %q %v", gen, rec, err)
		}
		if gen, rec, err := s.KeptLast(ctx, "never"); err != nil || gen != 0 || rec != nil {
			t.Errorf("last of a conversation without interpreters: %d %q %v", gen, rec, err)
		}
		if ok, _ := s.KeptSaved(ctx, "gens", 2, []byte(`{"gen":2}`)); ok {
			t.Error("a superseded interpreter's save was recorded")
		}
	})
}
