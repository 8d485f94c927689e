package store

import (
	"context"
	"errors"
	"fmt"

	"github.com/redis/go-redis/v9"
)

// Git keeps which client made each branch that the git tools pushed.
type Git struct{ *base }

// A branch that a client made through the git tools is that client's:
// another client allowed on the same repository may not add to it
// (gitexport). The record has no expiry: it holds for as long as the
// branch may, one short key per branch made.

// BranchOwner returns the client recorded as the maker of repo's branch,
// or "" when none is.
func (s *Git) BranchOwner(ctx context.Context, repo, branch string) (string, error) {
	owner, err := s.rdb.Get(ctx, branchOwnerKey(repo, branch)).Result()
	if errors.Is(err, redis.Nil) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("read the owner of branch %s: %w", branch, err)
	}
	return owner, nil
}

// SetBranchOwner records client as the maker of repo's branch unless a
// client is recorded already, and returns the one recorded.
func (s *Git) SetBranchOwner(ctx context.Context, repo, branch, client string) (string, error) {
	set, err := s.rdb.SetNX(ctx, branchOwnerKey(repo, branch), client, 0).Result()
	if err != nil {
		return "", fmt.Errorf("record the owner of branch %s: %w", branch, err)
	}
	if set {
		return client, nil
	}
	return s.BranchOwner(ctx, repo, branch)
}
