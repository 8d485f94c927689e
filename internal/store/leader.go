package store

import (
	"context"
	"fmt"
	"time"

	"github.com/runbox-dev/runbox/internal/store/internal/lease"
)

// The maintenance of a deployment (the watchdog that ends lost runs, the
// sweep of conversations, the janitors) is done by one process at a time:
// the one that holds the leader lease. Every api and executor tries to
// take it; a leader that dies loses it ttl after its last renewal.

// Lead takes the leader lease for holder, or renews it if holder has it,
// and reports whether holder leads.
func (s *Executors) Lead(ctx context.Context, holder string, ttl time.Duration) (bool, error) {
	ok, err := lease.Take(ctx, s.rdb, leaderKey, holder, ttl)
	if err != nil {
		return false, fmt.Errorf("leader lease: %w", err)
	}
	return ok, nil
}

// Resign gives the leader lease up, if holder has it, so that another
// process takes over at its next try.
func (s *Executors) Resign(ctx context.Context, holder string) error {
	if err := lease.Release(ctx, s.rdb, leaderKey, holder); err != nil {
		return fmt.Errorf("resign the leader lease: %w", err)
	}
	return nil
}
