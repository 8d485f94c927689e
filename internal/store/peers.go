package store

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/runbox-dev/runbox/internal/store/internal/keys"
)

// When an executor is found dead (its sandboxes reaped by a peer), what it
// held in Redis is released at once rather than when it would lapse.

// Beats returns when the heartbeat of each of the executors ids expires,
// in Unix milliseconds (0: it has none). A live executor's moves forward
// at every heartbeat; a dead one's stays where it was.
func (s *Executors) Beats(ctx context.Context, ids ...string) (map[string]int64, error) {
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

// releaseDeadScript unregisters a dead executor and expires its runs' leases,
// unless it beat since it was found dead.
//
// KEYS[1] executors zset, KEYS[2] the executor's key, KEYS[3] leases
// ARGV[1] executor id, ARGV[2] its heartbeat's expiry when found dead,
// ARGV[3] a run's key before its id (the id is followed by '}')
// Returns {0} if it beat since, else {1, ids of the runs it held...}.
var releaseDeadScript = redis.NewScript(`
local beat = tonumber(redis.call('ZSCORE', KEYS[1], ARGV[1]) or '0')
if beat > tonumber(ARGV[2]) then return {0} end
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('DEL', KEYS[2])
local out = {1}
for _, id in ipairs(redis.call('ZRANGE', KEYS[3], 0, -1)) do
  if redis.call('HGET', ARGV[3] .. id .. '}', 'executor') == ARGV[1] then
    redis.call('ZADD', KEYS[3], 0, id)
    table.insert(out, id)
  end
end
return out
`)

// ReleaseDead unregisters a dead executor and ends now the leases of the runs
// it holds, so that the watchdog ends those runs at its next look instead
// of a lease later — unless it has beaten since its peer found it dead
// (seen: its heartbeat's expiry then, Beats; 0 if it had none): an
// executor that restarted under the same id is alive again, and what it
// holds now is its own. It reports whether it released the executor, and
// the ids of the runs whose lease it ended.
func (s *Executors) ReleaseDead(ctx context.Context, executor string, seen int64) (released bool, runs []string, err error) {
	res, err := releaseDeadScript.Run(ctx, s.rdb, []string{executorsKey, executorKey(executor), leasesKey},
		executor, seen, strings.TrimSuffix(keys.Run(""), "}")).Slice()
	if err != nil {
		return false, nil, fmt.Errorf("release executor %s: %w", executor, err)
	}
	if n, _ := res[0].(int64); n == 0 {
		return false, nil, nil
	}
	for _, v := range res[1:] {
		if id, ok := v.(string); ok {
			runs = append(runs, id)
		}
	}
	return true, runs, nil
}
