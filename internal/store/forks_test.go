package store

import (
	"context"
	"testing"
	"time"

	"github.com/runbox-dev/runbox"
)

func TestClaimConversations(t *testing.T) {
	backends(t, func(t *testing.T, s *Store) {
		ctx := context.Background()
		if _, err := s.AllowConversation(ctx, "alice", "~alice~used", 0, time.Hour); err != nil {
			t.Fatal(err)
		}
		taken, err := s.ClaimConversations(ctx, []string{"~alice~a", "~alice~used", "~alice~b"}, time.Hour)
		if err != nil || taken != "~alice~used" {
			t.Fatalf("claim past a known conversation: %q, %v", taken, err)
		}
		// All or none: a was not claimed.
		if m, err := s.Mark(ctx, "~alice~a"); err != nil || m.Known {
			t.Errorf("a claimed by a refused claim: %+v, %v", m, err)
		}
		if taken, err := s.ClaimConversations(ctx, []string{"~alice~a", "~alice~b"}, time.Hour); err != nil || taken != "" {
			t.Fatalf("claim: %q, %v", taken, err)
		}
		if taken, _ := s.ClaimConversations(ctx, []string{"~alice~b"}, time.Hour); taken != "~alice~b" {
			t.Errorf("b claimed twice")
		}
		if err := s.ReleaseConversations(ctx, []string{"~alice~a", "~alice~b"}); err != nil {
			t.Fatal(err)
		}
		if taken, _ := s.ClaimConversations(ctx, []string{"~alice~b"}, time.Hour); taken != "" {
			t.Errorf("a released conversation is still claimed")
		}
	})
}

func TestMark(t *testing.T) {
	backends(t, func(t *testing.T, s *Store) {
		ctx := context.Background()
		if m, err := s.Mark(ctx, "c-r1"); err != nil || m != (runbox.Mark{}) {
			t.Fatalf("unused conversation: %+v, %v", m, err)
		}
		newRun(t, s, "r1")
		if _, _, err := s.FilesChanged(ctx, "c-r1", -1, time.Now()); err != nil {
			t.Fatal(err)
		}
		m, err := s.Mark(ctx, "c-r1")
		if err != nil || !m.Busy || m.LastRun != "r1" || m.Files == 0 {
			t.Errorf("conversation with a run: %+v, %v", m, err)
		}
	})
}

// TestAllowConversation: a new conversation counts against its client's
// hourly allowance and is known once admitted; one refused is not known,
// and is refused again; a known one is not counted again.
func TestAllowConversation(t *testing.T) {
	backends(t, func(t *testing.T, s *Store) {
		ctx := context.Background()
		allow := func(key string) bool {
			t.Helper()
			wait, err := s.AllowConversation(ctx, "alice", key, 2, time.Hour)
			if err != nil {
				t.Fatal(err)
			}
			return wait == 0
		}
		for _, tt := range []struct {
			key  string
			want bool
		}{
			{"~alice~a", true}, {"~alice~b", true}, {"~alice~a", true}, {"~alice~b", true},
			{"~alice~c", false}, {"~alice~c", false}, {"~alice~a", true},
		} {
			if got := allow(tt.key); got != tt.want {
				t.Errorf("AllowConversation(%s) = %v, want %v", tt.key, got, tt.want)
			}
		}
		if m, err := s.Mark(ctx, "~alice~c"); err != nil || m.Known {
			t.Errorf("a refused conversation is known: %+v, %v", m, err)
		}
	})
}
