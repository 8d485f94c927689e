package store

import (
	"context"
	"testing"
)

// TestBranchOwner: the first client recorded for a branch stays its
// owner; each repository's branches are its own.
func TestBranchOwner(t *testing.T) {
	backends(t, func(t *testing.T, s *Store) {
		ctx := context.Background()
		const repo = "git.example.com/acme/reports"
		if owner, err := s.BranchOwner(ctx, repo, "runbox/a"); err != nil || owner != "" {
			t.Fatalf("no record: %q %v", owner, err)
		}
		for _, tt := range []struct{ repo, client, want string }{
			{repo, "alice", "alice"},
			{repo, "bob", "alice"},
			{repo, "alice", "alice"},
			{"git.example.com/acme/other", "bob", "bob"},
		} {
			if owner, err := s.SetBranchOwner(ctx, tt.repo, "runbox/a", tt.client); err != nil || owner != tt.want {
				t.Fatalf("SetBranchOwner(%s, %s) = %q %v, want %q", tt.repo, tt.client, owner, err, tt.want)
			}
		}
		if owner, _ := s.BranchOwner(ctx, repo, "runbox/a"); owner != "alice" {
			t.Errorf("owner %q", owner)
		}
		if ttl := s.rdb.TTL(ctx, branchOwnerKey(repo, "runbox/a")).Val(); ttl >= 0 {
			t.Errorf("the record expires (%v)", ttl)
		}
	})
}
