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

// Wake announces that run id was enqueued.
func (s *Store) Wake(ctx context.Context, id string) error {
	_, err := s.rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
		p.LPush(ctx, wakeKey, id)
		p.LTrim(ctx, wakeKey, 0, wakeCap-1)
		return nil
	})
	if err != nil {
		return fmt.Errorf("announce run %s: %w", id, err)
	}
	return nil
}

// AwaitWake waits up to d for an announced run and returns its id, or ""
// when none came.
func (s *Store) AwaitWake(ctx context.Context, d time.Duration) (string, error) {
	res, err := s.rdb.BRPop(ctx, d, wakeKey).Result()
	switch {
	case errors.Is(err, redis.Nil):
		return "", nil
	case err != nil:
		return "", fmt.Errorf("wait for runs: %w", err)
	}
	return res[1], nil
}
