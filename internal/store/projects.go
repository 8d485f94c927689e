package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/runbox-dev/runbox"
)

// Projects keeps the records of projects (create_sandbox_for_project),
// and when each expires.
type Projects struct{ *base }

// SaveProject records p until it expires, and when it does, for the
// janitor (a day after, should the janitor be late).
func (s *Projects) SaveProject(ctx context.Context, p runbox.Project) error {
	b, err := json.Marshal(p)
	if err != nil {
		return err
	}
	pipe := s.rdb.TxPipeline()
	pipe.Set(ctx, projectKey(p.Conversation), b, time.Until(p.ExpiresAt))
	pipe.ZAdd(ctx, projectsKey, redis.Z{Score: float64(p.ExpiresAt.UnixMilli()), Member: p.Conversation})
	if _, err := pipe.Exec(ctx); err != nil {
		return fmt.Errorf("record project: %w", err)
	}
	return nil
}

// Project returns the live project of a conversation (its key).
func (s *Projects) Project(ctx context.Context, cid string) (runbox.Project, error) {
	var p runbox.Project
	b, err := s.rdb.Get(ctx, projectKey(cid)).Bytes()
	if errors.Is(err, redis.Nil) {
		return p, runbox.ErrProjectNotFound
	}
	if err != nil {
		return p, fmt.Errorf("read project: %w", err)
	}
	if err := json.Unmarshal(b, &p); err != nil {
		return p, fmt.Errorf("read project: %w", err)
	}
	return p, nil
}

// ExpiredProjects returns up to n conversations whose project expired by
// now.
func (s *Projects) ExpiredProjects(ctx context.Context, now time.Time, n int64) ([]string, error) {
	ids, err := s.rdb.ZRangeByScore(ctx, projectsKey, &redis.ZRangeBy{
		Min: "-inf", Max: strconv.FormatInt(now.UnixMilli(), 10), Count: n,
	}).Result()
	if err != nil {
		return nil, fmt.Errorf("read expired projects: %w", err)
	}
	return ids, nil
}

// RemoveProject forgets a conversation's project.
func (s *Projects) RemoveProject(ctx context.Context, cid string) error {
	pipe := s.rdb.TxPipeline()
	pipe.Del(ctx, projectKey(cid))
	pipe.ZRem(ctx, projectsKey, cid)
	if _, err := pipe.Exec(ctx); err != nil {
		return fmt.Errorf("remove project: %w", err)
	}
	return nil
}
