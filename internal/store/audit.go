package store

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

// The audit log (package audit) in Redis: replicas XADD raw entries to a
// stream; the sealer, holding a lease, chains them into a list and
// removes them from the stream in one script; a hash keeps the chain's
// head (seq, hash, last raw id sealed) and a string the checkpoint.
const (
	auditRawKey        = prefix + "audit:raw"
	auditLogKey        = prefix + "audit:log"
	auditHeadKey       = prefix + "audit:head"
	auditLeaseKey      = prefix + "audit:sealer"
	auditCheckpointKey = prefix + "audit:checkpoint"
)

// AuditAppend records a raw entry. It is the only audit write a call
// waits for.
func (s *Store) AuditAppend(ctx context.Context, entry []byte) error {
	if err := s.rdb.XAdd(ctx, &redis.XAddArgs{Stream: auditRawKey, Values: []any{"e", entry}}).Err(); err != nil {
		return fmt.Errorf("record audit entry: %w", err)
	}
	return nil
}

// AuditHead is where the sealed chain ends.
type AuditHead struct {
	Seq     int64
	Hash    string
	LastRaw string // id of the last raw entry sealed, "0-0" before any
}

// AuditHead returns the chain's head.
func (s *Store) AuditHead(ctx context.Context) (AuditHead, error) {
	m, err := s.rdb.HGetAll(ctx, auditHeadKey).Result()
	if err != nil {
		return AuditHead{}, fmt.Errorf("read audit head: %w", err)
	}
	h := AuditHead{Hash: m["hash"], LastRaw: m["raw"]}
	if h.LastRaw == "" {
		h.LastRaw = "0-0"
	}
	h.Seq, _ = strconv.ParseInt(m["seq"], 10, 64)
	return h, nil
}

// AuditRaw is a raw entry waiting to be sealed.
type AuditRaw struct {
	ID    string
	Entry string
}

// AuditPending returns up to n raw entries after id, waiting up to block
// for one when there is none (0: no wait).
func (s *Store) AuditPending(ctx context.Context, after string, n int64, block time.Duration) ([]AuditRaw, error) {
	var streams []redis.XStream
	var err error
	if block > 0 {
		streams, err = s.rdb.XRead(ctx, &redis.XReadArgs{Streams: []string{auditRawKey, after}, Count: n, Block: block}).Result()
	} else {
		var msgs []redis.XMessage
		msgs, err = s.rdb.XRangeN(ctx, auditRawKey, "("+after, "+", n).Result()
		streams = []redis.XStream{{Messages: msgs}}
	}
	if errors.Is(err, redis.Nil) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read raw audit entries: %w", err)
	}
	var out []AuditRaw
	for _, st := range streams {
		for _, m := range st.Messages {
			e, _ := m.Values["e"].(string)
			out = append(out, AuditRaw{ID: m.ID, Entry: e})
		}
	}
	return out, nil
}

// AuditLastRaw returns the id of the newest raw entry ("0-0" when none
// waits): everything recorded so far is sealed once the head reaches it.
func (s *Store) AuditLastRaw(ctx context.Context) (string, error) {
	msgs, err := s.rdb.XRevRangeN(ctx, auditRawKey, "+", "-", 1).Result()
	if err != nil {
		return "", fmt.Errorf("read raw audit entries: %w", err)
	}
	if len(msgs) == 0 {
		return "0-0", nil
	}
	return msgs[0].ID, nil
}

// AuditLease takes or renews the sealer's lease for holder.
func (s *Store) AuditLease(ctx context.Context, holder string, ttl time.Duration) (bool, error) {
	ok, err := leaseScript.Run(ctx, s.rdb, []string{auditLeaseKey}, holder, ttl.Milliseconds()).Int()
	if err != nil {
		return false, fmt.Errorf("audit sealer lease: %w", err)
	}
	return ok == 1, nil
}

// AuditRelease gives the lease up, if holder has it.
func (s *Store) AuditRelease(ctx context.Context, holder string) error {
	return releaseScript.Run(ctx, s.rdb, []string{auditLeaseKey}, holder).Err()
}

// ErrAuditConflict reports a seal that lost its lease or found the head
// moved: another sealer took over.
var ErrAuditConflict = errors.New("audit: another sealer moved the chain")

// AuditSeal appends sealed entries after head from, moves the head and
// removes their raw entries, if holder still holds the lease and the head
// is still from.
func (s *Store) AuditSeal(ctx context.Context, holder string, from, to AuditHead, sealed []string, rawIDs []string) error {
	args := []any{holder, from.LastRaw, to.Seq, to.Hash, to.LastRaw, len(sealed)}
	for _, e := range sealed {
		args = append(args, e)
	}
	for _, id := range rawIDs {
		args = append(args, id)
	}
	ok, err := sealScript.Run(ctx, s.rdb, []string{auditLeaseKey, auditHeadKey, auditLogKey, auditRawKey}, args...).Int()
	if err != nil {
		return fmt.Errorf("seal audit entries: %w", err)
	}
	if ok != 1 {
		return ErrAuditConflict
	}
	return nil
}

// AuditEntries returns sealed entries start..stop (list indexes; -1 is
// the last).
func (s *Store) AuditEntries(ctx context.Context, start, stop int64) ([]string, error) {
	v, err := s.rdb.LRange(ctx, auditLogKey, start, stop).Result()
	if err != nil {
		return nil, fmt.Errorf("read audit log: %w", err)
	}
	return v, nil
}

// AuditCheckpoint returns the checkpoint, "" when the log is whole.
func (s *Store) AuditCheckpoint(ctx context.Context) (string, error) {
	v, err := s.rdb.Get(ctx, auditCheckpointKey).Result()
	if errors.Is(err, redis.Nil) {
		return "", nil
	}
	if err != nil {
		return "", fmt.Errorf("read audit checkpoint: %w", err)
	}
	return v, nil
}

// AuditTrim removes the n oldest sealed entries and sets the checkpoint
// that now starts the log, if holder still holds the lease.
func (s *Store) AuditTrim(ctx context.Context, holder string, n int64, checkpoint string) error {
	ok, err := trimScript.Run(ctx, s.rdb, []string{auditLeaseKey, auditLogKey, auditCheckpointKey}, holder, n, checkpoint).Int()
	if err != nil {
		return fmt.Errorf("trim audit log: %w", err)
	}
	if ok != 1 {
		return ErrAuditConflict
	}
	return nil
}

// leaseScript takes a free lease or renews one's own.
// KEYS[1] lease; ARGV[1] holder, ARGV[2] ttl (ms)
var leaseScript = redis.NewScript(`
local cur = redis.call('GET', KEYS[1])
if cur and cur ~= ARGV[1] then return 0 end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return 1
`)

// releaseScript gives up one's own lease.
// KEYS[1] lease; ARGV[1] holder
var releaseScript = redis.NewScript(`
if redis.call('GET', KEYS[1]) == ARGV[1] then redis.call('DEL', KEYS[1]) end
return 1
`)

// sealScript: KEYS[1] lease, KEYS[2] head, KEYS[3] log, KEYS[4] raw stream
// ARGV[1] holder, ARGV[2] the head's raw id expected, ARGV[3] new seq,
// ARGV[4] new hash, ARGV[5] new raw id, ARGV[6] n sealed, ARGV[7..6+n]
// sealed entries, the rest raw ids to delete.
var sealScript = redis.NewScript(`
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
local raw = redis.call('HGET', KEYS[2], 'raw') or '0-0'
if raw ~= ARGV[2] then return 0 end
local n = tonumber(ARGV[6])
for i = 7, 6 + n do redis.call('RPUSH', KEYS[3], ARGV[i]) end
redis.call('HSET', KEYS[2], 'seq', ARGV[3], 'hash', ARGV[4], 'raw', ARGV[5])
for i = 7 + n, #ARGV do redis.call('XDEL', KEYS[4], ARGV[i]) end
return 1
`)

// trimScript: KEYS[1] lease, KEYS[2] log, KEYS[3] checkpoint
// ARGV[1] holder, ARGV[2] n, ARGV[3] checkpoint
var trimScript = redis.NewScript(`
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
redis.call('LTRIM', KEYS[2], tonumber(ARGV[2]), -1)
redis.call('SET', KEYS[3], ARGV[3])
return 1
`)
