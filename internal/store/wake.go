package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
)

// asynq's workers cannot be woken: an idle one finds a new task at its next
// poll (see FACTS). So that an idle executor need not poll often, every run
// enqueued is also announced on a list that idle executors wait on; the one
// that pops it claims and runs the run at once. asynq remains the queue of
// record: it hands the task out too, later, and its handler finds the run
// claimed.

// wakeCap bounds the announcements kept while no executor takes them:
// runs announced and not taken are run by asynq all the same.
const wakeCap = 10000

// wakeListTTL bounds how long an executor's announcements outlive it.
const wakeListTTL = 24 * time.Hour

// Wake announces that run id was enqueued: to executor, when the run is
// for it (its conversation's owner), else to every executor.
func (s *Executors) Wake(ctx context.Context, id, executor string) error {
	key := wakeKey
	if executor != "" {
		key = wakeExecutorKey(executor)
	}
	_, err := s.rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
		p.LPush(ctx, key, id)
		p.LTrim(ctx, key, 0, wakeCap-1)
		if executor != "" {
			p.Expire(ctx, key, wakeListTTL)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("announce run %s: %w", id, err)
	}
	return nil
}

// AwaitWake waits up to d for a run announced to executor, or to every
// executor, and returns its id, or "" when none came. mineFirst says which
// list is looked at first when both hold runs; callers alternate, so that
// neither starves the other.
func (s *Executors) AwaitWake(ctx context.Context, d time.Duration, executor string, mineFirst bool) (string, error) {
	keys := []string{wakeExecutorKey(executor), wakeKey}
	if !mineFirst {
		keys[0], keys[1] = keys[1], keys[0]
	}
	res, err := s.rdb.BRPop(ctx, d, keys...).Result()
	switch {
	case errors.Is(err, redis.Nil):
		return "", nil
	case err != nil:
		return "", fmt.Errorf("wait for runs: %w", err)
	}
	return res[1], nil
}
