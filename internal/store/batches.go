package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"

	"github.com/redis/go-redis/v9"

	"github.com/runbox-dev/runbox"
	"github.com/runbox-dev/runbox/internal/store/internal/keys"
)

// A batch is up to runbox.MaxBatchRuns runs recorded and enqueued by one
// script: their records and queued events, their place in their
// conversations and, for those that head their conversations and whose
// client's turn allows (admissionLua's head), their tasks in asynq
// (written where asynq keeps them, TaskQueue); the others are let go as
// the client's runs are claimed and end, as runs submitted alone are. The
// batch's own record counts its runs by state as they start and end
// (claimScript, transitionScript) and writes the batch's webhook when the
// last ends. A batch is held whole to its client's bounds and to its
// conversations' waiting runs before anything is written.
//
// Keys: runbox:batch:{<id>} (client, total, created, callback, running,
// ended, succeeded, failed, cancelled, finished, cancelling), its runs in
// order runbox:batch:{<id>}:runs.

func batchKey(id string) string { return prefix + "batch:{" + id + "}" }

func batchRunsKey(id string) string { return prefix + "batch:{" + id + "}:runs" }

// Batches keeps batches of runs: their records and counts, their runs
// recorded and enqueued in one script.
type Batches struct{ *base }

// batchRunArgs is how many arguments each run of a batch takes
// (createBatchScript).
const batchRunArgs = 10

// createBatchScript records a batch and its runs, as createScript records
// one run: each joins its conversation — as its head, its task written
// where asynq keeps it and announced to idle executors (as Executors.Wake
// does) when its client's turn allows, else waiting in the client's ready
// set; or behind the head, in its pending list. Nothing is written when
// the batch is past its client's queue or seconds, or would leave more
// than ARGV[6] runs waiting in one of its conversations.
//
// KEYS[1] the batch, KEYS[2] its runs, KEYS[3] the client's recent runs,
// KEYS[4] the client's runs queued or running, KEYS[5] its bounds,
// KEYS[6] the idempotency key (ignored when ARGV[14] is "")
// ARGV[1] batch id, ARGV[2] client, ARGV[3] created (unix ms), ARGV[4] ttl
// (s), ARGV[5] queued event, ARGV[6] most runs waiting per conversation,
// ARGV[7] when a run stops counting as queued or running should its end
// be lost (unix ms), ARGV[8] now (unix ns, asynq's pending_since),
// ARGV[9] key prefix, ARGV[10] queue name, ARGV[11] its task key prefix,
// ARGV[12] its pending list, ARGV[13] the set of queue names,
// ARGV[14] idempotency "" or "1", ARGV[15] batch callback ("" none),
// ARGV[16] most announcements kept, ARGV[17] the bytes the runs hold,
// ARGV[18..21] the client's bounds (most runs and bytes queued,
// concurrent runs, seconds a day), ARGV[22] today (the seconds' key
// suffix), ARGV[23] the seconds the runs reserve,
// ARGV[24] n, then n runs of batchRunArgs: id, conversation key,
// language, interactive, spec, callback ("" none), "1" to tell of its
// start, task, bytes, seconds.
// Returns {"created", batch id, runs enqueued}, {"exists", batch id},
// {"busy", conversation key} or a refusal as createScript's.
var createBatchScript = redis.NewScript(admissionLua + `
if ARGV[14] ~= '' then
  local prev = redis.call('GET', KEYS[6])
  if prev then return {'exists', prev} end
end
if redis.call('EXISTS', KEYS[1]) == 1 then return {'exists', ARGV[1]} end
local p, ttl, created, client = ARGV[9], tonumber(ARGV[4]), ARGV[3], ARGV[2]
local now = tonumber(created)
local n, R = tonumber(ARGV[24]), ` + strconv.Itoa(batchRunArgs) + `
local full = room(p, client, n, tonumber(ARGV[17]), tonumber(ARGV[18]), tonumber(ARGV[19]))
if full then return full end
local perDay = tonumber(ARGV[21])
if perDay > 0 then
  local used, reserved = secondsLeft(p, client, ARGV[22])
  if used + reserved + tonumber(ARGV[23]) > perDay then return {'seconds', tostring(used + reserved), ARGV[23]} end
end
local per = {}
for i = 0, n - 1 do
  local cid = ARGV[26 + R * i]
  per[cid] = (per[cid] or 0) + 1
end
for cid, k in pairs(per) do
  local ahead = 0
  if redis.call('EXISTS', p .. 'conv:' .. cid .. ':head') == 0 then ahead = 1 end
  if redis.call('LLEN', p .. 'conv:' .. cid .. ':pending') + k - ahead > tonumber(ARGV[6]) then return {'busy', cid} end
end
redis.call('HSET', KEYS[1], 'id', ARGV[1], 'client', client, 'total', n, 'created', created,
  'running', 0, 'ended', 0, 'succeeded', 0, 'failed', 0, 'cancelled', 0)
if ARGV[15] ~= '' then redis.call('HSET', KEYS[1], 'callback', ARGV[15]) end
redis.call('EXPIRE', KEYS[1], ttl)
redis.call('ZREMRANGEBYSCORE', KEYS[4], '-inf', created)
redis.call('HSET', KEYS[5], 'concurrent', ARGV[20])
redis.call('EXPIRE', KEYS[5], ttl)
local ev = '{"seq":1,' .. string.sub(ARGV[5], 2)
local enqueued = 0
for i = 0, n - 1 do
  local b = 25 + R * i
  local id, cid = ARGV[b], ARGV[b + 1]
  local run = p .. 'run:{' .. id .. '}'
  redis.call('HSET', run, 'status', 'queued', 'seq', 1, 'id', id, 'conversation', cid, 'language', ARGV[b + 2],
    'created', created, 'interactive', ARGV[b + 3], 'spec', ARGV[b + 4], 'client', client, 'batch', ARGV[1])
  if ARGV[b + 5] ~= '' then
    redis.call('HSET', run, 'callback', ARGV[b + 5])
    if ARGV[b + 6] ~= '' then redis.call('HSET', run, 'notify_started', '1') end
  end
  redis.call('EXPIRE', run, ttl)
  local events = p .. 'run:{' .. id .. '}:events'
  redis.call('RPUSH', events, ev)
  redis.call('EXPIRE', events, ttl)
  local runs = p .. 'conv:' .. cid .. ':runs'
  redis.call('ZADD', runs, created, id)
  redis.call('EXPIRE', runs, ttl)
  redis.call('SET', p .. 'conv:' .. cid .. ':known', 1, 'EX', ttl)
  redis.call('ZADD', KEYS[3], created, id)
  redis.call('RPUSH', KEYS[2], id)
  queue(p, client, id, tonumber(ARGV[b + 8]), ttl)
  if perDay > 0 then reserve(p, client, id, tonumber(ARGV[b + 9]), ttl) end
  redis.call('ZADD', KEYS[4], ARGV[7], id)
  if redis.call('SET', p .. 'conv:' .. cid .. ':head', id, 'NX') then
    redis.call('SADD', p .. 'convs:busy', cid)
    if head(p, client, id, now, ttl) then
      local task = ARGV[11] .. id
      if redis.call('EXISTS', task) == 0 then
        redis.call('HSET', task, 'msg', ARGV[b + 7], 'state', 'pending', 'pending_since', ARGV[8])
        redis.call('LPUSH', ARGV[12], id)
      end
      redis.call('LPUSH', p .. 'wake', id)
      enqueued = enqueued + 1
    end
  else
    local pending = p .. 'conv:' .. cid .. ':pending'
    redis.call('RPUSH', pending, id)
    redis.call('EXPIRE', pending, ttl)
  end
end
redis.call('PEXPIREAT', KEYS[4], ARGV[7])
redis.call('ZREMRANGEBYRANK', KEYS[3], 0, -1001)
redis.call('EXPIRE', KEYS[3], ttl)
redis.call('EXPIRE', KEYS[2], ttl)
if enqueued > 0 then
  redis.call('LTRIM', p .. 'wake', 0, tonumber(ARGV[16]) - 1)
  redis.call('SADD', ARGV[13], ARGV[10])
end
if ARGV[14] ~= '' then redis.call('SET', KEYS[6], ARGV[1], 'EX', ttl) end
return {'created', ARGV[1], tostring(enqueued)}
`)

// CreateBatch records a batch and its runs and enqueues those that head
// their conversations and whose client's turn allows, in one script; or
// refuses it whole (see createBatchScript). It returns the batch's id: an
// earlier batch's, with created false, when the idempotency key was used
// before.
func (s *Batches) CreateBatch(ctx context.Context, nb runbox.NewBatch) (string, bool, error) {
	ev, err := eventBody(runbox.Event{TS: nb.CreatedAt, Type: runbox.EventQueued})
	if err != nil {
		return "", false, err
	}
	idem, idemKey := "", prefix+"idem:-"
	if nb.IdempotencyKey != "" {
		idem, idemKey = "1", batchIdempotencyKey(nb.Client, nb.IdempotencyKey)
	}
	created := nb.CreatedAt.UnixMilli()
	q := nb.Queue
	runs := make([]any, 0, batchRunArgs*len(nb.Runs))
	bytes, secs := 0, 0
	for _, r := range nb.Runs {
		spec, err := json.Marshal(r.Spec)
		if err != nil {
			return "", false, err
		}
		started := ""
		if r.Callback.Started {
			started = "1"
		}
		size := len(spec) + len(r.Task) + recordOverhead
		bytes += size
		secs += r.Spec.TimeoutSeconds
		runs = append(runs, r.Run.ID, r.Run.ConversationID, r.Run.Language, boolField(r.Run.Interactive),
			string(spec), r.Callback.URL, started, string(r.Task), size, r.Spec.TimeoutSeconds)
	}
	args := make([]any, 0, 24+len(runs))
	args = append(args, nb.ID, nb.Client, created, s.ttlSeconds(), ev, max(nb.MaxWaiting, 1),
		nb.CreatedAt.Add(activeRunHorizon).UnixMilli(), nb.CreatedAt.UnixNano(), prefix,
		q.Name, q.TaskKeyPrefix, q.PendingKey, q.QueuesKey, idem, nb.Callback, wakeCap, bytes)
	args = append(args, boundsArgs(nb.Bounds)...)
	args = append(args, dayKey(s.now()), secs, len(nb.Runs))
	args = append(args, runs...)
	res, err := createBatchScript.Run(ctx, s.rdb, []string{batchKey(nb.ID), batchRunsKey(nb.ID),
		clientRunsKey(nb.Client), activeRunsKey(nb.Client), boundsKey(nb.Client), idemKey}, args...).StringSlice()
	if err != nil {
		return "", false, fmt.Errorf("create batch: %w", err)
	}
	switch {
	case len(res) >= 2 && res[0] == "busy":
		_, id, _ := runbox.ParseConversationKey(res[1])
		return "", false, runbox.Limited(runbox.EBusy, queuedRetry,
			"the batch would leave more than %d runs waiting in conversation %s, as runs submitted alone may; split it", max(nb.MaxWaiting, 1), id)
	case len(res) >= 2 && (res[0] == "created" || res[0] == "exists"):
		return res[1], res[0] == "created", nil
	}
	return "", false, refusal(res, nb.Bounds)
}

func batchIdempotencyKey(client, key string) string {
	return prefix + "idem:" + client + ":batch:" + key
}

// batchEndLua defines batchEnded(): a run of batch went from status from
// to the final status to; the batch counts it (and is kept ttl from now,
// as its runs are), and when it was the last to end, records when and
// writes the batch's webhook. It needs notify (notifyLua).
const batchEndLua = `
local function batchEnded(p, batch, from, to, now, ttl)
  local key = p .. 'batch:{' .. batch .. '}'
  if redis.call('EXISTS', key) == 0 then return end
  redis.call('EXPIRE', key, ttl)
  redis.call('EXPIRE', key .. ':runs', ttl)
  local bucket = 'failed'
  if to == 'succeeded' or to == 'cancelled' then bucket = to end
  redis.call('HINCRBY', key, bucket, 1)
  if from == 'running' then redis.call('HINCRBY', key, 'running', -1) end
  local ended = redis.call('HINCRBY', key, 'ended', 1)
  if ended == tonumber(redis.call('HGET', key, 'total')) then
    redis.call('HSET', key, 'finished', now)
    local f = redis.call('HMGET', key, 'callback', 'client')
    if f[1] then notify(p, batch, 'completed', 'batch.completed', f[1], f[2], now, ttl) end
  end
end
`

// Batch returns a batch's record.
func (s *Batches) Batch(ctx context.Context, id string) (runbox.BatchRecord, error) {
	m, err := s.rdb.HGetAll(ctx, batchKey(id)).Result()
	if err != nil {
		return runbox.BatchRecord{}, fmt.Errorf("read batch %s: %w", id, err)
	}
	if m["id"] == "" {
		return runbox.BatchRecord{}, runbox.ErrBatchNotFound
	}
	n := func(f string) int { v, _ := strconv.Atoi(m[f]); return v }
	b := runbox.BatchRecord{
		Batch: runbox.Batch{ID: m["id"], Total: n("total"), Running: n("running"), Succeeded: n("succeeded"),
			Failed: n("failed"), Cancelled: n("cancelled"), CreatedAt: msTime(m["created"]), FinishedAt: msTime(m["finished"])},
		Client: m["client"], Callback: m["callback"], Cancelling: m["cancelling"] == "1",
	}
	b.Queued = max(0, b.Total-b.Running-n("ended"))
	return b, nil
}

// BatchRuns returns the ids of a batch's runs from offset, up to limit
// (all when limit is 0), in the order they were given.
func (s *Batches) BatchRuns(ctx context.Context, id string, offset, limit int) ([]string, error) {
	ids, err := s.rdb.LRange(ctx, batchRunsKey(id), int64(offset), int64(offset+limit-1)).Result()
	if err != nil {
		return nil, fmt.Errorf("read runs of batch %s: %w", id, err)
	}
	return ids, nil
}

// RunsOf returns the records of runs ids, in that order, in one round
// trip; a run that expired is left out.
func (s *Batches) RunsOf(ctx context.Context, ids []string) ([]runbox.Run, error) {
	pipe := s.rdb.Pipeline()
	cmds := make([]*redis.MapStringStringCmd, len(ids))
	for i, id := range ids {
		cmds[i] = pipe.HGetAll(ctx, keys.Run(id))
	}
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return nil, fmt.Errorf("read runs: %w", err)
	}
	out := make([]runbox.Run, 0, len(ids))
	for _, c := range cmds {
		run, err := parseRun(c.Val())
		if errors.Is(err, runbox.ErrRunNotFound) {
			continue
		}
		if err != nil {
			return nil, err
		}
		out = append(out, run)
	}
	return out, nil
}

// CancellingBatch records that a batch was asked to stop, so that its
// runs still waiting in the gate are not let in.
func (s *Batches) CancellingBatch(ctx context.Context, id string) error {
	n, err := s.rdb.Exists(ctx, batchKey(id)).Result()
	if err != nil {
		return fmt.Errorf("cancel batch %s: %w", id, err)
	}
	if n == 0 {
		return runbox.ErrBatchNotFound
	}
	if err := s.rdb.HSet(ctx, batchKey(id), "cancelling", "1").Err(); err != nil {
		return fmt.Errorf("cancel batch %s: %w", id, err)
	}
	return nil
}
