package store

import (
	"bytes"
	"context"
	"slices"
	"testing"
	"time"
)

func TestFilesVersion(t *testing.T) {
	backends(t, func(t *testing.T, s *Store) {
		ctx := context.Background()
		t0 := time.Unix(1000, 0)
		if v, err := s.FilesVersion(ctx, "c"); err != nil || v != 0 {
			t.Fatalf("new conversation: version %d, %v", v, err)
		}
		v1, current, err := s.FilesChanged(ctx, "c", 0, t0)
		if err != nil || !current || v1 <= 0 {
			t.Fatalf("first change: %d %v %v", v1, current, err)
		}
		// An upload meanwhile: the executor's copy at v1 is not current.
		v2, _, _ := s.FilesChanged(ctx, "c", -1, t0)
		v3, current, _ := s.FilesChanged(ctx, "c", v1, t0.Add(time.Minute))
		if current || !(v1 < v2 && v2 < v3) {
			t.Errorf("change from a stale copy: %d %d %d current=%v", v1, v2, v3, current)
		}
		if got, _ := s.FilesVersion(ctx, "c"); got != v3 {
			t.Errorf("version %d, want %d", got, v3)
		}
		// Versions come from one clock: another conversation never gets
		// one a copy of this one holds.
		if w, _, _ := s.FilesChanged(ctx, "d", 0, t0); w <= v3 {
			t.Errorf("other conversation's version %d", w)
		}
		if err := s.FilesUsed(ctx, "e", t0.Add(2*time.Minute)); err != nil {
			t.Fatal(err)
		}
		old, err := s.FilesUnusedSince(ctx, t0.Add(30*time.Second), 10)
		if err != nil || !slices.Equal(old, []string{"d"}) {
			t.Errorf("unused: %v, %v", old, err)
		}
		if err := s.FilesRemoved(ctx, "c"); err != nil {
			t.Fatal(err)
		}
		if v, _ := s.FilesVersion(ctx, "c"); v != 0 {
			t.Errorf("removed conversation has version %d", v)
		}
		if v, _, _ := s.FilesChanged(ctx, "c", 0, t0); v <= v3 {
			t.Errorf("a version came back: %d", v)
		}
	})
}

func TestFileSecret(t *testing.T) {
	backends(t, func(t *testing.T, s *Store) {
		ctx := context.Background()
		a, err := s.FileSecret(ctx, func() []byte { return []byte("first-secret-000") })
		if err != nil {
			t.Fatal(err)
		}
		b, _ := s.FileSecret(ctx, func() []byte { return []byte("second-secret-00") })
		if !bytes.Equal(a, b) || string(a) != "first-secret-000" {
			t.Errorf("secrets %q %q", a, b)
		}
	})
}
