package store

import (
	"context"
	"errors"
	"fmt"

	"github.com/redis/go-redis/v9"
)

// When an executor is found dead (its sandboxes reaped by a peer), what it
// held in Redis is released at once rather than when it would lapse.

// Beats returns when the heartbeat of each of the executors ids expires,
// in Unix milliseconds (0: it has none). A live executor's moves forward
// at every heartbeat; a dead one's stays where it was.
func (s *Store) Beats(ctx context.Context, ids ...string) (map[string]int64, error) {
	cmds := make([]*redis.FloatCmd, len(ids))
	_, err := s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, id := range ids {
			cmds[i] = p.ZScore(ctx, executorsKey, id)
		}
		return nil
	})
	if err != nil && !errors.Is(err, redis.Nil) {
		return nil, fmt.Errorf("read heartbeats: %w", err)
	}
	beats := make(map[string]int64, len(ids))
	for i, id := range ids {
		v, err := cmds[i].Result()
		if err != nil && !errors.Is(err, redis.Nil) {
			return nil, fmt.Errorf("read heartbeats: %w", err)
		}
		beats[id] = int64(v)
	}
	return beats, nil
}

// ExpireLeasesOf ends now the leases of the runs executor holds, so that
// the watchdog ends those runs at its next look instead of a lease later.
// It returns the runs' ids.
func (s *Store) ExpireLeasesOf(ctx context.Context, executor string) ([]string, error) {
	ids, err := s.rdb.ZRange(ctx, leasesKey, 0, -1).Result()
	if err != nil {
		return nil, fmt.Errorf("read leases: %w", err)
	}
	if len(ids) == 0 {
		return nil, nil
	}
	cmds := make([]*redis.StringCmd, len(ids))
	_, err = s.rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
		for i, id := range ids {
			cmds[i] = p.HGet(ctx, runKey(id), "executor")
		}
		return nil
	})
	if err != nil && !errors.Is(err, redis.Nil) {
		return nil, fmt.Errorf("read runs' executors: %w", err)
	}
	var held []redis.Z
	var out []string
	for i, id := range ids {
		if v, _ := cmds[i].Result(); v == executor {
			held = append(held, redis.Z{Score: 0, Member: id})
			out = append(out, id)
		}
	}
	if len(held) == 0 {
		return nil, nil
	}
	// XX: a lease the run's end deleted meanwhile stays deleted.
	if err := s.rdb.ZAddXX(ctx, leasesKey, held...).Err(); err != nil {
		return nil, fmt.Errorf("expire leases: %w", err)
	}
	return out, nil
}
