package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
)

// A conversation's runs go to the executor that holds its sandbox and kept
// interpreter while that executor lives: the executor records itself as
// the conversation's owner after each run, for as long as it keeps an idle
// sandbox, and the scheduler routes the conversation's next run to it.

// SetOwner records executor as the holder of conversation cid's sandbox
// for ttl.
func (s *Executors) SetOwner(ctx context.Context, cid, executor string, ttl time.Duration) error {
	if err := s.rdb.Set(ctx, ownerKey(cid), executor, ttl).Err(); err != nil {
		return fmt.Errorf("record the owner of %s: %w", cid, err)
	}
	return nil
}

// ownerScript returns the executor that runs a conversation's live runs,
// or else its owner, if its heartbeat is current and it is not draining;
// else "". (A draining executor's live runs still keep their
// conversation's next run: claimScript would hand it back there.)
//
// KEYS[1] the conversation's owner, KEYS[2] its live runs (claimScript)
// ARGV[1] prefix of executors' heartbeat keys, ARGV[2] of their draining
// marks
var ownerScript = redis.NewScript(`
local holder = redis.call("HGET", KEYS[2], "executor")
if holder and redis.call("HLEN", KEYS[2]) > 1 and redis.call("EXISTS", ARGV[1] .. holder) == 1 then
  return holder
end
local owner = redis.call("GET", KEYS[1])
if not owner then return "" end
if redis.call("EXISTS", ARGV[1] .. owner) == 1 and redis.call("EXISTS", ARGV[2] .. owner) == 0 then return owner end
return ""
`)

// Drain marks executor as shutting down for ttl (until Unregister): the
// conversations it owns go to any executor from now on.
func (s *Executors) Drain(ctx context.Context, executor string, ttl time.Duration) error {
	if err := s.rdb.Set(ctx, drainingKey(executor), 1, ttl).Err(); err != nil {
		return fmt.Errorf("mark %s draining: %w", executor, err)
	}
	return nil
}

// Owner returns the live executor that runs conversation cid's live runs
// or holds its sandbox, or "" when none does.
func (s *Executors) Owner(ctx context.Context, cid string) (string, error) {
	owner, err := ownerScript.Run(ctx, s.rdb, []string{ownerKey(cid), conversationLiveKey(cid)},
		executorKey(""), drainingKey("")).Text()
	if err != nil && !errors.Is(err, redis.Nil) {
		return "", fmt.Errorf("read the owner of %s: %w", cid, err)
	}
	return owner, nil
}

// Unowned returns how many of the conversations keys (each counted once)
// no executor holds a sandbox for, in one round trip: those a batch's runs
// would give a sandbox each.
func (s *Executors) Unowned(ctx context.Context, keys []string) (int, error) {
	pipe := s.rdb.Pipeline()
	seen := make(map[string]*redis.IntCmd, len(keys))
	for _, k := range keys {
		if _, dup := seen[k]; !dup {
			seen[k] = pipe.Exists(ctx, ownerKey(k))
		}
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return 0, fmt.Errorf("read conversations' owners: %w", err)
	}
	n := 0
	for _, c := range seen {
		if c.Val() == 0 {
			n++
		}
	}
	return n, nil
}
