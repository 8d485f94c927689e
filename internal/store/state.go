package store

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

// keptStateMemory is how long the store remembers that a conversation
// had kept state, so that a run finding it gone can say so.
const keptStateMemory = 7 * 24 * time.Hour

// KeptState records what a kept-state run of a conversation found and
// reports whether state earlier runs left was lost. fresh says the run's
// interpreter was started for it; died says the interpreter died with the
// run. State is lost when a fresh interpreter replaces one that had run
// (whatever took it: idle TTL, eviction, close_session, a restart, another
// executor), or when it dies with the run; after that the conversation
// starts over, and its next fresh interpreter loses nothing.
func (s *Conversations) KeptState(ctx context.Context, cid string, fresh, died bool) (lost bool, err error) {
	key := keptStateKey(cid)
	switch {
	case died:
		if err := s.rdb.Del(ctx, key).Err(); err != nil {
			return true, fmt.Errorf("record lost state of %s: %w", cid, err)
		}
		return true, nil
	case fresh:
		err := s.rdb.SetArgs(ctx, key, 1, redis.SetArgs{TTL: keptStateMemory, Get: true}).Err()
		if errors.Is(err, redis.Nil) {
			return false, nil
		}
		if err != nil {
			return false, fmt.Errorf("record kept state of %s: %w", cid, err)
		}
		return true, nil
	default:
		if err := s.rdb.Set(ctx, key, 1, keptStateMemory).Err(); err != nil {
			return false, fmt.Errorf("record kept state of %s: %w", cid, err)
		}
		return false, nil
	}
}

// A conversation's kept interpreters: the generation of the last one
// started, and the record of its saved snapshot (internal/snapshot).
func keptGenKey(cid string) string  { return prefix + "kept:{" + cid + "}:gen" }
func keptSnapKey(cid string) string { return prefix + "kept:{" + cid + "}:snap" }

// keptStartedScript counts an interpreter's start and hands over the
// saved snapshot's record, which no later start may have.
//
// KEYS[1] generation, KEYS[2] record; ARGV[1] ttl (s).
// Returns {generation, record or false}.
var keptStartedScript = redis.NewScript(`
local gen = redis.call('INCR', KEYS[1])
redis.call('EXPIRE', KEYS[1], ARGV[1])
local rec = redis.call('GET', KEYS[2])
redis.call('DEL', KEYS[2])
return {gen, rec}
`)

// keptSavedScript records a snapshot's record if its generation is the
// last one started.
//
// KEYS[1] generation, KEYS[2] record; ARGV[1] the snapshot's generation,
// ARGV[2] its record, ARGV[3] ttl (s). Returns 1 if recorded, else 0.
var keptSavedScript = redis.NewScript(`
if tonumber(redis.call('GET', KEYS[1]) or '0') ~= tonumber(ARGV[1]) then return 0 end
redis.call('SET', KEYS[2], ARGV[2], 'EX', ARGV[3])
redis.call('EXPIRE', KEYS[1], ARGV[3])
return 1
`)

// KeptStarted records that a kept interpreter of the conversation starts
// (fresh or restored) and returns its generation, and the record of the
// saved snapshot, if any: taken, so that no later start restores it.
func (s *Conversations) KeptStarted(ctx context.Context, cid string) (int64, []byte, error) {
	res, err := keptStartedScript.Run(ctx, s.rdb, []string{keptGenKey(cid), keptSnapKey(cid)},
		int(keptStateMemory.Seconds())).Slice()
	if err != nil || len(res) != 2 {
		return 0, nil, fmt.Errorf("record a kept interpreter of %s: %w", cid, err)
	}
	gen, _ := res[0].(int64)
	rec, _ := res[1].(string)
	if rec == "" {
		return gen, nil, nil
	}
	return gen, []byte(rec), nil
}

// KeptSaved records the saved snapshot of the conversation's interpreter
// of generation gen, unless a later one has started; it reports whether
// it did.
func (s *Conversations) KeptSaved(ctx context.Context, cid string, gen int64, rec []byte) (bool, error) {
	n, err := keptSavedScript.Run(ctx, s.rdb, []string{keptGenKey(cid), keptSnapKey(cid)},
		gen, rec, int(keptStateMemory.Seconds())).Int()
	if err != nil {
		return false, fmt.Errorf("record the snapshot of %s: %w", cid, err)
	}
	return n == 1, nil
}

// KeptLast returns the generation of the conversation's last interpreter
// (0 for none yet) and the record of its saved snapshot, if any (nil),
// taking nothing: a fork reads the source's this way.
func (s *Conversations) KeptLast(ctx context.Context, cid string) (int64, []byte, error) {
	res, err := s.rdb.MGet(ctx, keptGenKey(cid), keptSnapKey(cid)).Result()
	if err != nil {
		return 0, nil, fmt.Errorf("read the kept interpreters of %s: %w", cid, err)
	}
	var gen int64
	if g, ok := res[0].(string); ok {
		if gen, err = strconv.ParseInt(g, 10, 64); err != nil {
			return 0, nil, fmt.Errorf("read the kept interpreters of %s: %w", cid, err)
		}
	}
	if rec, ok := res[1].(string); ok && rec != "" {
		return gen, []byte(rec), nil
	}
	return gen, nil, nil
}
