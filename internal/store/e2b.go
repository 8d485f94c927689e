package store

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/runbox-dev/runbox"
)

// E2B keeps E2B sandboxes' records (internal/e2b): each by its id, which
// is unique across clients (requests to a sandbox name no client), every
// client's by when they started, and the running ones by when they end.
type E2B struct{ *base }

// E2B keys.
func e2bSandboxKey(id string) string    { return prefix + "e2b:sbx:" + id }
func e2bClientKey(client string) string { return prefix + "e2b:client:" + client }

const e2bEndsKey = prefix + "e2b:ends"

// e2bSaveLua writes a sandbox's record (ARGV[2]) of version ARGV[1]
// unless it is gone (-1) or was saved since that version was read (0);
// a running one is held in the ends by ARGV[3] (ms), a paused one not.
const e2bSaveLua = `
local v = redis.call('HGET', KEYS[1], 'v')
if not v then return -1 end
if tonumber(v) ~= tonumber(ARGV[1]) then return 0 end
redis.call('HSET', KEYS[1], 'rec', ARGV[2], 'v', tonumber(v) + 1)
if ARGV[3] == '' then
  redis.call('ZREM', KEYS[2], ARGV[4])
else
  redis.call('ZADD', KEYS[2], ARGV[3], ARGV[4])
end
return 1
`

var e2bSaveScript = redis.NewScript(e2bSaveLua)

// e2bCreateScript records a new sandbox, unless its id is taken.
var e2bCreateScript = redis.NewScript(`
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
redis.call('HSET', KEYS[1], 'rec', ARGV[1], 'v', 0)
redis.call('ZADD', KEYS[2], ARGV[2], ARGV[4])
redis.call('ZADD', KEYS[3], ARGV[3], ARGV[4])
return 1
`)

// e2bDueScript takes up to ARGV[2] sandboxes whose end came by ARGV[1]
// (ms): each is its taker's to end, and comes due again at ARGV[3] (ms)
// should its taker not (it died on the way).
var e2bDueScript = redis.NewScript(`
local ids = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, tonumber(ARGV[2]))
for _, id in ipairs(ids) do redis.call('ZADD', KEYS[1], ARGV[3], id) end
return ids
`)

// e2bDueLease is how long a sandbox taken as due is its taker's.
const e2bDueLease = 30 * time.Second

func endScore(sb runbox.E2BSandbox) string {
	if sb.State != runbox.E2BRunning {
		return ""
	}
	return strconv.FormatInt(sb.EndAt.UnixMilli(), 10)
}

// CreateE2BSandbox records a new sandbox (Version 0); false when its id is
// taken.
func (s *E2B) CreateE2BSandbox(ctx context.Context, sb runbox.E2BSandbox) (bool, error) {
	sb.Version = 0
	b, err := json.Marshal(sb)
	if err != nil {
		return false, err
	}
	n, err := e2bCreateScript.Run(ctx, s.rdb, []string{e2bSandboxKey(sb.ID), e2bClientKey(sb.Client), e2bEndsKey},
		b, sb.StartedAt.UnixMilli(), sb.EndAt.UnixMilli(), sb.ID).Int()
	if err != nil {
		return false, fmt.Errorf("record e2b sandbox: %w", err)
	}
	return n == 1, nil
}

// E2BSandbox returns a sandbox's record: runbox.ErrE2BSandboxNotFound when
// there is none.
func (s *E2B) E2BSandbox(ctx context.Context, id string) (runbox.E2BSandbox, error) {
	var sb runbox.E2BSandbox
	vals, err := s.rdb.HMGet(ctx, e2bSandboxKey(id), "rec", "v").Result()
	if err != nil {
		return sb, fmt.Errorf("read e2b sandbox: %w", err)
	}
	rec, ok := vals[0].(string)
	if !ok {
		return sb, runbox.ErrE2BSandboxNotFound
	}
	if err := json.Unmarshal([]byte(rec), &sb); err != nil {
		return sb, fmt.Errorf("read e2b sandbox: %w", err)
	}
	v, _ := vals[1].(string)
	sb.Version, _ = strconv.ParseInt(v, 10, 64)
	return sb, nil
}

// SaveE2BSandbox writes sb over its record, provided nothing saved it
// since sb was read (its Version): runbox.ErrE2BConflict otherwise, and
// runbox.ErrE2BSandboxNotFound when it is gone.
func (s *E2B) SaveE2BSandbox(ctx context.Context, sb runbox.E2BSandbox) error {
	version := sb.Version
	sb.Version = 0
	b, err := json.Marshal(sb)
	if err != nil {
		return err
	}
	n, err := e2bSaveScript.Run(ctx, s.rdb, []string{e2bSandboxKey(sb.ID), e2bEndsKey},
		version, b, endScore(sb), sb.ID).Int()
	switch {
	case err != nil:
		return fmt.Errorf("save e2b sandbox: %w", err)
	case n == -1:
		return runbox.ErrE2BSandboxNotFound
	case n == 0:
		return runbox.ErrE2BConflict
	}
	return nil
}

// DeleteE2BSandbox forgets a sandbox.
func (s *E2B) DeleteE2BSandbox(ctx context.Context, sb runbox.E2BSandbox) error {
	pipe := s.rdb.TxPipeline()
	pipe.Del(ctx, e2bSandboxKey(sb.ID))
	pipe.ZRem(ctx, e2bClientKey(sb.Client), sb.ID)
	pipe.ZRem(ctx, e2bEndsKey, sb.ID)
	if _, err := pipe.Exec(ctx); err != nil {
		return fmt.Errorf("remove e2b sandbox: %w", err)
	}
	return nil
}

// ClientE2BSandboxes returns up to n of a client's sandboxes, newest
// first, from place start on, and whether there are more after them: the
// i-th is at place start+i, nil when it was removed while listed.
func (s *E2B) ClientE2BSandboxes(ctx context.Context, client string, start, n int64) ([]*runbox.E2BSandbox, bool, error) {
	ids, err := s.rdb.ZRevRange(ctx, e2bClientKey(client), start, start+n).Result()
	if err != nil {
		return nil, false, fmt.Errorf("list e2b sandboxes: %w", err)
	}
	more := int64(len(ids)) > n
	if more {
		ids = ids[:n]
	}
	pipe := s.rdb.Pipeline()
	cmds := make([]*redis.SliceCmd, len(ids))
	for i, id := range ids {
		cmds[i] = pipe.HMGet(ctx, e2bSandboxKey(id), "rec", "v")
	}
	if len(ids) > 0 {
		if _, err := pipe.Exec(ctx); err != nil {
			return nil, false, fmt.Errorf("list e2b sandboxes: %w", err)
		}
	}
	out := make([]*runbox.E2BSandbox, len(ids))
	for i, c := range cmds {
		vals := c.Val()
		rec, ok := vals[0].(string)
		if !ok {
			continue // removed since it was listed
		}
		sb := &runbox.E2BSandbox{}
		if err := json.Unmarshal([]byte(rec), sb); err != nil {
			return nil, false, fmt.Errorf("list e2b sandboxes: %w", err)
		}
		v, _ := vals[1].(string)
		sb.Version, _ = strconv.ParseInt(v, 10, 64)
		out[i] = sb
	}
	return out, more, nil
}

// DueE2BSandboxes takes up to n running sandboxes whose end came by now,
// for the caller to end: a sandbox taken comes due again in 30 s unless
// it is removed or saved (which sets its end) before.
func (s *E2B) DueE2BSandboxes(ctx context.Context, now time.Time, n int) ([]string, error) {
	ids, err := e2bDueScript.Run(ctx, s.rdb, []string{e2bEndsKey}, now.UnixMilli(), n,
		now.Add(e2bDueLease).UnixMilli()).StringSlice()
	if err != nil {
		return nil, fmt.Errorf("take ended e2b sandboxes: %w", err)
	}
	return ids, nil
}

// LiveE2BSandboxes returns up to n running sandboxes whose end is after
// now, the soonest first.
func (s *E2B) LiveE2BSandboxes(ctx context.Context, now time.Time, n int64) ([]string, error) {
	ids, err := s.rdb.ZRangeByScore(ctx, e2bEndsKey, &redis.ZRangeBy{
		Min: "(" + strconv.FormatInt(now.UnixMilli(), 10), Max: "+inf", Count: n,
	}).Result()
	if err != nil {
		return nil, fmt.Errorf("list live e2b sandboxes: %w", err)
	}
	return ids, nil
}
