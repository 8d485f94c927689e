package store

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

// Where conversations' files live in a shared file store (S3), executors
// keep a working copy of each conversation they run. A copy is current
// when it was made at the version Redis holds for the conversation: every
// change to the store's files (an upload, what a run wrote, a close) takes
// a new version from one clock, so a version never comes back, and a
// conversation with no version has no files. A warm run checks its copy
// with one GET.

// FilesVersion returns the version of a conversation's files; 0 when it
// has none.
func (s *Conversations) FilesVersion(ctx context.Context, cid string) (int64, error) {
	v, err := s.rdb.Get(ctx, filesVersionKey(cid)).Int64()
	if err != nil && !errors.Is(err, redis.Nil) {
		return 0, fmt.Errorf("read the version of %s's files: %w", cid, err)
	}
	return v, nil
}

// filesChangedScript takes a new version for a conversation's files and
// marks its use; it also says whether the version before was ARGV[1].
var filesChangedScript = redis.NewScript(`
local before = tonumber(redis.call("GET", KEYS[1]) or "0")
local v = redis.call("INCR", KEYS[2])
redis.call("SET", KEYS[1], v)
redis.call("ZADD", KEYS[3], ARGV[2], ARGV[3])
if before == tonumber(ARGV[1]) then return {v, 1} end
return {v, 0}
`)

// FilesChanged records a change of a conversation's files in the store,
// made from a copy at version seen (-1: from none), and returns the new
// version, and whether the copy was current, so that with the change it
// is the store's at the new version.
func (s *Conversations) FilesChanged(ctx context.Context, cid string, seen int64, now time.Time) (version int64, current bool, err error) {
	res, err := filesChangedScript.Run(ctx, s.rdb, []string{filesVersionKey(cid), filesClockKey, filesUsedKey},
		seen, now.UnixMilli(), cid).Int64Slice()
	if err != nil {
		return 0, false, fmt.Errorf("record a change of %s's files: %w", cid, err)
	}
	return res[0], res[1] == 1, nil
}

// FilesUsed marks a use of a conversation's files that changed nothing.
func (s *Conversations) FilesUsed(ctx context.Context, cid string, now time.Time) error {
	if err := s.rdb.ZAdd(ctx, filesUsedKey, redis.Z{Score: float64(now.UnixMilli()), Member: cid}).Err(); err != nil {
		return fmt.Errorf("mark the use of %s's files: %w", cid, err)
	}
	return nil
}

// FilesRemoved records that a conversation's files were removed from the
// store: it has none, and no use.
func (s *Conversations) FilesRemoved(ctx context.Context, cid string) error {
	_, err := s.rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
		p.Del(ctx, filesVersionKey(cid))
		p.ZRem(ctx, filesUsedKey, cid)
		return nil
	})
	if err != nil {
		return fmt.Errorf("forget %s's files: %w", cid, err)
	}
	return nil
}

// FilesUnusedSince returns up to n conversations whose files were last
// used before t.
func (s *Conversations) FilesUnusedSince(ctx context.Context, t time.Time, n int64) ([]string, error) {
	ids, err := s.rdb.ZRangeByScore(ctx, filesUsedKey, &redis.ZRangeBy{
		Min: "-inf", Max: "(" + strconv.FormatInt(t.UnixMilli(), 10), Count: n,
	}).Result()
	if err != nil {
		return nil, fmt.Errorf("list unused conversations: %w", err)
	}
	return ids, nil
}

// FileSecret returns the key download links are signed with, made by the
// first process to ask, so that every api and executor sharing this Redis
// signs alike.
func (s *Conversations) FileSecret(ctx context.Context, make func() []byte) ([]byte, error) {
	if err := s.rdb.SetNX(ctx, fileSecretKey, make(), 0).Err(); err != nil {
		return nil, fmt.Errorf("store the file secret: %w", err)
	}
	b, err := s.rdb.Get(ctx, fileSecretKey).Bytes()
	if err != nil {
		return nil, fmt.Errorf("read the file secret: %w", err)
	}
	return b, nil
}
