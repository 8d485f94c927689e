package store

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/runbox-dev/runbox"
)

// Forks (conversations.Service.Fork) make conversations several at a time:
// their ids are counted together against the client's new conversations
// an hour (AllowConversations) and claimed together, before anything is
// copied.

func (s *Conversations) Mark(ctx context.Context, cid string) (runbox.Mark, error) {
	pipe := s.rdb.Pipeline()
	known := pipe.Exists(ctx, knownConvKey(cid))
	busy := pipe.Exists(ctx, conversationHeadKey(cid), conversationLiveKey(cid))
	last := pipe.ZRevRange(ctx, conversationRunsKey(cid), 0, 0)
	files := pipe.Get(ctx, filesVersionKey(cid))
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return runbox.Mark{}, fmt.Errorf("read conversation %s: %w", cid, err)
	}
	m := runbox.Mark{Known: known.Val() > 0, Busy: busy.Val() > 0}
	if ids := last.Val(); len(ids) > 0 {
		m.LastRun = ids[0]
	}
	m.Files, _ = files.Int64() // redis.Nil: no version
	return m, nil
}

// claimConvsScript marks every conversation of KEYS known for ARGV[1] ms, unless
// one is known already: then it marks none and returns that one's index
// (1-based); 0 when all were claimed.
var claimConvsScript = redis.NewScript(`
for i, k in ipairs(KEYS) do
  if redis.call("EXISTS", k) == 1 then return i end
end
for _, k in ipairs(KEYS) do redis.call("SET", k, 1, "PX", ARGV[1]) end
return 0
`)

// ClaimConversations marks the conversation keys cids known for ttl, all
// or none: it returns the first that was known already ("" when all are
// now claimed).
func (s *Conversations) ClaimConversations(ctx context.Context, cids []string, ttl time.Duration) (string, error) {
	keys := make([]string, len(cids))
	for i, c := range cids {
		keys[i] = knownConvKey(c)
	}
	i, err := claimConvsScript.Run(ctx, s.rdb, keys, ttl.Milliseconds()).Int()
	if err != nil {
		return "", fmt.Errorf("claim conversations: %w", err)
	}
	if i > 0 {
		return cids[i-1], nil
	}
	return "", nil
}

// ReleaseConversations undoes ClaimConversations, for conversations that
// were not made after all.
func (s *Conversations) ReleaseConversations(ctx context.Context, cids []string) error {
	keys := make([]string, len(cids))
	for i, c := range cids {
		keys[i] = knownConvKey(c)
	}
	if err := s.rdb.Del(ctx, keys...).Err(); err != nil {
		return fmt.Errorf("release conversations: %w", err)
	}
	return nil
}
