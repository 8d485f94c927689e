// Package auditlog keeps the audit log (package audit) in Redis.
package auditlog

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/runbox-dev/runbox/internal/store"
	"github.com/runbox-dev/runbox/internal/store/internal/keys"
	"github.com/runbox-dev/runbox/internal/store/internal/lease"
)

// The audit log (package audit) in Redis: replicas XADD raw entries to a
// stream; the sealer, holding a lease, chains them into a list and
// removes them from the stream in one script; a hash keeps the chain's
// head (seq, hash, last raw id sealed) and a string the checkpoint. The
// oldest sealed entries move out of Redis to segments in the file store
// when the list passes its bound; a list indexes the segments, in order.
const (
	prefix             = keys.Prefix
	auditRawKey        = prefix + "audit:raw"
	auditLogKey        = prefix + "audit:log"
	auditHeadKey       = prefix + "audit:head"
	auditLeaseKey      = prefix + "audit:sealer"
	auditCheckpointKey = prefix + "audit:checkpoint"
	auditSegmentsKey   = prefix + "audit:segments"
)

// Log is the audit log's part of the shared state.
type Log struct {
	rdb redis.UniversalClient
}

// New returns the Log on c.
func New(c *store.Conn) *Log { return &Log{rdb: c.Redis()} }

// Append records a raw entry. It is the only audit write a call
// waits for.
func (l *Log) Append(ctx context.Context, entry []byte) error {
	if err := l.rdb.XAdd(ctx, &redis.XAddArgs{Stream: auditRawKey, Values: []any{"e", entry}}).Err(); err != nil {
		return fmt.Errorf("record audit entry: %w", err)
	}
	return nil
}

// Head is where the sealed chain ends.
type Head struct {
	Seq     int64
	Hash    string
	LastRaw string // id of the last raw entry sealed, "0-0" before any
}

// Head returns the chain's head.
func (l *Log) Head(ctx context.Context) (Head, error) {
	m, err := l.rdb.HGetAll(ctx, auditHeadKey).Result()
	if err != nil {
		return Head{}, fmt.Errorf("read audit head: %w", err)
	}
	h := Head{Hash: m["hash"], LastRaw: m["raw"]}
	if h.LastRaw == "" {
		h.LastRaw = "0-0"
	}
	h.Seq, _ = strconv.ParseInt(m["seq"], 10, 64)
	return h, nil
}

// Raw is a raw entry waiting to be sealed.
type Raw struct {
	ID    string
	Entry string
}

// Pending returns up to n raw entries after id, waiting up to block
// for one when there is none (0: no wait).
func (l *Log) Pending(ctx context.Context, after string, n int64, block time.Duration) ([]Raw, error) {
	var streams []redis.XStream
	var err error
	if block > 0 {
		streams, err = l.rdb.XRead(ctx, &redis.XReadArgs{Streams: []string{auditRawKey, after}, Count: n, Block: block}).Result()
	} else {
		var msgs []redis.XMessage
		msgs, err = l.rdb.XRangeN(ctx, auditRawKey, "("+after, "+", n).Result()
		streams = []redis.XStream{{Messages: msgs}}
	}
	if errors.Is(err, redis.Nil) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read raw audit entries: %w", err)
	}
	var out []Raw
	for _, st := range streams {
		for _, m := range st.Messages {
			e, _ := m.Values["e"].(string)
			out = append(out, Raw{ID: m.ID, Entry: e})
		}
	}
	return out, nil
}

// LastRaw returns the id of the newest raw entry ("0-0" when none
// waits): everything recorded so far is sealed once the head reaches it.
func (l *Log) LastRaw(ctx context.Context) (string, error) {
	msgs, err := l.rdb.XRevRangeN(ctx, auditRawKey, "+", "-", 1).Result()
	if err != nil {
		return "", fmt.Errorf("read raw audit entries: %w", err)
	}
	if len(msgs) == 0 {
		return "0-0", nil
	}
	return msgs[0].ID, nil
}

// Lease takes or renews the sealer's lease for holder.
func (l *Log) Lease(ctx context.Context, holder string, ttl time.Duration) (bool, error) {
	ok, err := lease.Take(ctx, l.rdb, auditLeaseKey, holder, ttl)
	if err != nil {
		return false, fmt.Errorf("audit sealer lease: %w", err)
	}
	return ok, nil
}

// Release gives the lease up, if holder has it.
func (l *Log) Release(ctx context.Context, holder string) error {
	return lease.Release(ctx, l.rdb, auditLeaseKey, holder)
}

// ErrConflict reports a seal that lost its lease or found the head
// moved: another sealer took over.
var ErrConflict = errors.New("audit: another sealer moved the chain")

// Seal appends sealed entries after head from, moves the head and
// removes their raw entries, if holder still holds the lease and the head
// is still from. It returns how many sealed entries Redis holds then.
func (l *Log) Seal(ctx context.Context, holder string, from, to Head, sealed []string, rawIDs []string) (int64, error) {
	args := []any{holder, from.LastRaw, to.Seq, to.Hash, to.LastRaw, len(sealed)}
	for _, e := range sealed {
		args = append(args, e)
	}
	for _, id := range rawIDs {
		args = append(args, id)
	}
	n, err := sealScript.Run(ctx, l.rdb, []string{auditLeaseKey, auditHeadKey, auditLogKey, auditRawKey}, args...).Int64()
	if err != nil {
		return 0, fmt.Errorf("seal audit entries: %w", err)
	}
	if n < 0 {
		return 0, ErrConflict
	}
	return n, nil
}

// Entries returns sealed entries start..stop (list indexes; -1 is
// the last).
func (l *Log) Entries(ctx context.Context, start, stop int64) ([]string, error) {
	v, err := l.rdb.LRange(ctx, auditLogKey, start, stop).Result()
	if err != nil {
		return nil, fmt.Errorf("read audit log: %w", err)
	}
	return v, nil
}

// Checkpoint returns the checkpoint, "" when the log is whole.
func (l *Log) Checkpoint(ctx context.Context) (string, error) {
	v, err := l.rdb.Get(ctx, auditCheckpointKey).Result()
	if errors.Is(err, redis.Nil) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("read audit checkpoint: %w", err)
	}
	return v, nil
}

// Trim removes the n oldest sealed entries and sets the checkpoint
// that now starts the log, if holder still holds the lease.
func (l *Log) Trim(ctx context.Context, holder string, n int64, checkpoint string) error {
	ok, err := trimScript.Run(ctx, l.rdb, []string{auditLeaseKey, auditLogKey, auditCheckpointKey}, holder, n, checkpoint).Int()
	if err != nil {
		return fmt.Errorf("trim audit log: %w", err)
	}
	if ok != 1 {
		return ErrConflict
	}
	return nil
}

// Len returns how many sealed entries Redis holds.
func (l *Log) Len(ctx context.Context) (int64, error) {
	n, err := l.rdb.LLen(ctx, auditLogKey).Result()
	if err != nil {
		return 0, fmt.Errorf("read audit log: %w", err)
	}
	return n, nil
}

// Page returns up to n sealed entries from the one numbered seq on,
// and the number of the oldest entry Redis holds (0: none). The list's
// head moves as entries leave it, so entries are found by number: when
// head is past seq, the entries before head have left Redis (to a
// segment, or past retention) and none are returned.
func (l *Log) Page(ctx context.Context, seq, n int64) (head int64, entries []string, err error) {
	v, err := pageScript.Run(ctx, l.rdb, []string{auditLogKey}, seq, n).StringSlice()
	if err != nil {
		return 0, nil, fmt.Errorf("read audit log: %w", err)
	}
	head, err = strconv.ParseInt(v[0], 10, 64)
	if err != nil {
		return 0, nil, fmt.Errorf("read audit log: the oldest entry's number: %w", err)
	}
	return head, v[1:], nil
}

// Archived returns the checkpoint ("" when the log is whole) and the
// index of the segments in the file store, read at one instant.
func (l *Log) Archived(ctx context.Context) (string, []string, error) {
	var cp *redis.StringCmd
	var segs *redis.StringSliceCmd
	_, err := l.rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
		cp = p.Get(ctx, auditCheckpointKey)
		segs = p.LRange(ctx, auditSegmentsKey, 0, -1)
		return nil
	})
	if err != nil && !errors.Is(err, redis.Nil) {
		return "", nil, fmt.Errorf("read audit segments: %w", err)
	}
	checkpoint, err := cp.Result()
	if err != nil && !errors.Is(err, redis.Nil) {
		return "", nil, fmt.Errorf("read audit checkpoint: %w", err)
	}
	return checkpoint, segs.Val(), nil
}

// Exported moves the n oldest sealed entries out of the list, and
// appends segment to the index, once they are in the file store: if
// holder still holds the lease and the oldest entry is still first.
func (l *Log) Exported(ctx context.Context, holder, first string, n int64, segment string) error {
	ok, err := exportedScript.Run(ctx, l.rdb, []string{auditLeaseKey, auditLogKey, auditSegmentsKey}, holder, first, n, segment).Int()
	if err != nil {
		return fmt.Errorf("trim exported audit entries: %w", err)
	}
	if ok != 1 {
		return ErrConflict
	}
	return nil
}

// DropSegment removes the oldest segment from the index, past
// retention, and sets the checkpoint the log now starts from: if holder
// still holds the lease and segment is still the oldest.
func (l *Log) DropSegment(ctx context.Context, holder, segment, checkpoint string) error {
	ok, err := dropSegmentScript.Run(ctx, l.rdb, []string{auditLeaseKey, auditSegmentsKey, auditCheckpointKey}, holder, segment, checkpoint).Int()
	if err != nil {
		return fmt.Errorf("drop audit segment: %w", err)
	}
	if ok != 1 {
		return ErrConflict
	}
	return nil
}

// sealScript: KEYS[1] lease, KEYS[2] head, KEYS[3] log, KEYS[4] raw stream
// ARGV[1] holder, ARGV[2] the head's raw id expected, ARGV[3] new seq,
// ARGV[4] new hash, ARGV[5] new raw id, ARGV[6] n sealed, ARGV[7..6+n]
// sealed entries, the rest raw ids to delete. Returns the log's length,
// -1 when the lease or the head is not what the caller holds.
var sealScript = redis.NewScript(`
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return -1 end
local raw = redis.call('HGET', KEYS[2], 'raw') or '0-0'
if raw ~= ARGV[2] then return -1 end
local n = tonumber(ARGV[6])
for i = 7, 6 + n do redis.call('RPUSH', KEYS[3], ARGV[i]) end
redis.call('HSET', KEYS[2], 'seq', ARGV[3], 'hash', ARGV[4], 'raw', ARGV[5])
for i = 7 + n, #ARGV do redis.call('XDEL', KEYS[4], ARGV[i]) end
return redis.call('LLEN', KEYS[3])
`)

// trimScript: KEYS[1] lease, KEYS[2] log, KEYS[3] checkpoint
// ARGV[1] holder, ARGV[2] n, ARGV[3] checkpoint
var trimScript = redis.NewScript(`
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('LTRIM', KEYS[2], tonumber(ARGV[2]), -1)
redis.call('SET', KEYS[3], ARGV[3])
return 1
`)

// pageScript: KEYS[1] log; ARGV[1] seq, ARGV[2] n. Returns the oldest
// entry's seq (0: empty), then the entries from seq on, if it is held.
var pageScript = redis.NewScript(`
local first = redis.call('LINDEX', KEYS[1], 0)
if not first then return {'0'} end
local head = cjson.decode(first).seq
local pos = tonumber(ARGV[1]) - head
local out = {}
if pos >= 0 then out = redis.call('LRANGE', KEYS[1], pos, pos + tonumber(ARGV[2]) - 1) end
table.insert(out, 1, string.format('%d', head))
return out
`)

// exportedScript: KEYS[1] lease, KEYS[2] log, KEYS[3] segments
// ARGV[1] holder, ARGV[2] the oldest entry, ARGV[3] n, ARGV[4] segment
var exportedScript = redis.NewScript(`
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
if redis.call('LINDEX', KEYS[2], 0) ~= ARGV[2] then return 0 end
redis.call('LTRIM', KEYS[2], tonumber(ARGV[3]), -1)
redis.call('RPUSH', KEYS[3], ARGV[4])
return 1
`)

// dropSegmentScript: KEYS[1] lease, KEYS[2] segments, KEYS[3] checkpoint
// ARGV[1] holder, ARGV[2] segment, ARGV[3] checkpoint
var dropSegmentScript = redis.NewScript(`
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
if redis.call('LINDEX', KEYS[2], 0) ~= ARGV[2] then return 0 end
redis.call('LPOP', KEYS[2])
redis.call('SET', KEYS[3], ARGV[3])
return 1
`)
