package store

import (
	"context"
	"errors"
	"fmt"
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
func (s *Store) KeptState(ctx context.Context, cid string, fresh, died bool) (lost bool, err error) {
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
