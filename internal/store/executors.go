package store

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/runbox-dev/runbox"
)

// Executors keeps the registry of executors: their heartbeats and what
// they announce (runners, templates, where their sandboxes are reached),
// the conversations each holds (owner.go), the release of a dead one's
// runs (peers.go), the announcements of runs to idle ones (wake.go), and
// which process leads the maintenance (leader.go).
type Executors struct{ *base }

// heartbeatScript registers an executor as alive.
//
// KEYS[1] executors zset, KEYS[2] the executor's info
// ARGV[1] executor id, ARGV[2] info JSON, ARGV[3] ttl (ms)
var heartbeatScript = redis.NewScript(`
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[3]), ARGV[1])
redis.call('SET', KEYS[2], ARGV[2], 'PX', ARGV[3])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - 3600000)
return 1
`)

// liveExecutorsScript returns the records of the executors whose
// heartbeat is current, in one round trip (one is read on every run's
// submission).
//
// KEYS[1] executors zset, KEYS[2] an executor record's key without its id
var liveExecutorsScript = redis.NewScript(`
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local out = {}
for _, id in ipairs(redis.call('ZRANGEBYSCORE', KEYS[1], now, '+inf')) do
  local v = redis.call('GET', KEYS[2] .. id)
  if v then out[#out + 1] = v end
end
return out
`)

// Heartbeat registers an executor as alive for ttl.
func (s *Executors) Heartbeat(ctx context.Context, info runbox.ExecutorInfo, ttl time.Duration) error {
	b, err := json.Marshal(info)
	if err != nil {
		return err
	}
	err = heartbeatScript.Run(ctx, s.rdb, []string{executorsKey, executorKey(info.ID)},
		info.ID, string(b), ttl.Milliseconds()).Err()
	if err != nil {
		return fmt.Errorf("heartbeat: %w", err)
	}
	return nil
}

// Deployment returns the id of the deployment this Redis serves, making
// one on first use. Executors label their containers with it, so that one
// may remove a dead peer's sandboxes without touching those of another
// deployment that shares the Docker Engine.
func (s *Executors) Deployment(ctx context.Context) (string, error) {
	if err := s.rdb.SetNX(ctx, deploymentKey, rand.Text(), 0).Err(); err != nil {
		return "", fmt.Errorf("make deployment id: %w", err)
	}
	id, err := s.rdb.Get(ctx, deploymentKey).Result()
	if err != nil {
		return "", fmt.Errorf("read deployment id: %w", err)
	}
	return id, nil
}

// Unregister removes an executor from the registry.
func (s *Executors) Unregister(ctx context.Context, id string) error {
	pipe := s.rdb.TxPipeline()
	pipe.ZRem(ctx, executorsKey, id)
	pipe.Del(ctx, executorKey(id), drainingKey(id))
	_, err := pipe.Exec(ctx)
	return err
}

// LiveExecutors returns the executors whose heartbeat is current.
func (s *Executors) LiveExecutors(ctx context.Context) ([]runbox.ExecutorInfo, error) {
	vals, err := liveExecutorsScript.Run(ctx, s.rdb, []string{executorsKey, executorKey("")}).StringSlice()
	if err != nil {
		return nil, fmt.Errorf("read executors: %w", err)
	}
	if len(vals) == 0 {
		return nil, nil
	}
	infos := make([]runbox.ExecutorInfo, 0, len(vals))
	for _, v := range vals {
		var info runbox.ExecutorInfo
		if json.Unmarshal([]byte(v), &info) == nil {
			infos = append(infos, info)
		}
	}
	return infos, nil
}

// Landlock reports whether a live executor's sandboxes hold programs to
// filesystem rules.
func (s *Executors) Landlock(ctx context.Context) (bool, error) {
	infos, err := s.LiveExecutors(ctx)
	if err != nil {
		return false, err
	}
	return slices.ContainsFunc(infos, func(i runbox.ExecutorInfo) bool { return i.Landlock }), nil
}

// HeldConversations returns how many conversations hold a sandbox on a live
// executor, as their heartbeats last said.
func (s *Executors) HeldConversations(ctx context.Context) (int, error) {
	infos, err := s.LiveExecutors(ctx)
	n := 0
	for _, i := range infos {
		n += i.Conversations
	}
	return n, err
}

// Runners returns the languages offered by live executors, one entry per
// language, sorted by language.
func (s *Executors) Runners(ctx context.Context) ([]runbox.Runner, error) {
	infos, err := s.LiveExecutors(ctx)
	if err != nil {
		return nil, err
	}
	seen := map[string]runbox.Runner{}
	for _, info := range infos {
		for _, r := range info.Runners {
			if _, ok := seen[r.Language]; !ok {
				seen[r.Language] = r
			}
		}
	}
	out := make([]runbox.Runner, 0, len(seen))
	for _, r := range seen {
		out = append(out, r)
	}
	slices.SortFunc(out, func(a, b runbox.Runner) int { return cmp.Compare(a.Language, b.Language) })
	return out, nil
}

// ExecutorInfo returns what a live executor announced about itself.
func (s *Executors) ExecutorInfo(ctx context.Context, id string) (runbox.ExecutorInfo, error) {
	var info runbox.ExecutorInfo
	b, err := s.rdb.Get(ctx, executorKey(id)).Bytes()
	if errors.Is(err, redis.Nil) {
		return info, runbox.ErrExecutorGone
	}
	if err != nil {
		return info, fmt.Errorf("read executor %s: %w", id, err)
	}
	if err := json.Unmarshal(b, &info); err != nil {
		return info, fmt.Errorf("read executor %s: %w", id, err)
	}
	return info, nil
}
