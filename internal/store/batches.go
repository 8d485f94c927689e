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
// conversations and their tasks in asynq (written where asynq keeps them,
// TaskQueue), and the batch's own record, which counts its runs by state
// as they start and end (claimScript, transitionScript) and writes the
// batch's webhook when the last ends.
//
// A client's runs queued or running at once are bounded (its tier's
// concurrent_runs, or a window the api sets): the batch's runs past the
// bound wait, recorded and queued, in the client's gate, and are let in
// as the client's runs end (Finish) or the sweep finds room (ReleaseGated).
//
// Keys: runbox:batch:{<id>} (client, total, created, callback, running,
// ended, succeeded, failed, cancelled, finished, cancelling), its runs in
// order runbox:batch:{<id>}:runs, a client's gate runbox:client:<c>:gate
// and its settings runbox:client:<c>:gate:conf (limit, and where asynq
// keeps the queue's tasks), and the clients with a gate runbox:gates.

func batchKey(id string) string { return prefix + "batch:{" + id + "}" }

func batchRunsKey(id string) string { return prefix + "batch:{" + id + "}:runs" }

func gateKey(client string) string { return prefix + "client:" + client + ":gate" }

func gateConfKey(client string) string {
	return prefix + "client:" + client + ":gate:conf"
}

const gatesKey = prefix + "gates"

// Batches keeps batches of runs: their records and counts, their runs
// recorded and enqueued in one script, and the clients' gates their runs
// wait in.
type Batches struct{ *base }

// releaseMax bounds the runs one release lets in.
const releaseMax = 1000

// admitLua defines admit(): a run joins its client's runs queued or
// running and its conversation — as its head, its task written where
// asynq keeps it and announced to idle executors (as Executors.Wake does), or
// behind the head, in its pending list. It reports whether the run heads
// its conversation.
//
// q holds the queue's name, task key prefix and pending list.
const admitLua = `
local function admit(p, q, id, cid, msg, active, horizon, nowns, ttl)
  redis.call('ZADD', active, horizon, id)
  redis.call('EXPIRE', active, ttl)
  local head = p .. 'conv:' .. cid .. ':head'
  if redis.call('SET', head, id, 'NX') then
    redis.call('SADD', p .. 'convs:busy', cid)
    local task = q.tasks .. id
    if redis.call('EXISTS', task) == 0 then
      redis.call('HSET', task, 'msg', msg, 'state', 'pending', 'pending_since', nowns)
      redis.call('LPUSH', q.pending, id)
    end
    redis.call('LPUSH', p .. 'wake', id)
    return true
  end
  local pending = p .. 'conv:' .. cid .. ':pending'
  redis.call('RPUSH', pending, id)
  redis.call('EXPIRE', pending, ttl)
  return false
end
`

// createBatchScript records a batch and its runs, as createScript records
// one run, and admits as many as the window leaves room for (none while
// runs of earlier batches wait in the client's gate); the others wait in
// the gate, their tasks kept in their records until their turn.
//
// KEYS[1] the batch, KEYS[2] its runs, KEYS[3] the client's recent runs,
// KEYS[4] the client's runs queued or running, KEYS[5] its gate,
// KEYS[6] the gate's settings, KEYS[7] clients with a gate,
// KEYS[8] the idempotency key (ignored when ARGV[14] is "")
// ARGV[1] batch id, ARGV[2] client, ARGV[3] created (unix ms), ARGV[4] ttl
// (s), ARGV[5] queued event, ARGV[6] window (0: none), ARGV[7] when a run
// stops counting as queued or running should its end be lost (unix ms),
// ARGV[8] now (unix ns, asynq's pending_since), ARGV[9] key prefix,
// ARGV[10] queue name, ARGV[11] its task key prefix, ARGV[12] its pending
// list, ARGV[13] the set of queue names, ARGV[14] idempotency "" or "1",
// ARGV[15] batch callback ("" none), ARGV[16] most announcements kept,
// ARGV[17] n, then n runs of 8: id, conversation key, language,
// interactive, spec, callback ("" none), "1" to tell of its start, task.
// Returns {"created", batch id, runs admitted} or {"exists", batch id}.
var createBatchScript = redis.NewScript(admitLua + `
if ARGV[14] ~= '' then
  local prev = redis.call('GET', KEYS[8])
  if prev then return {'exists', prev} end
end
if redis.call('EXISTS', KEYS[1]) == 1 then return {'exists', ARGV[1]} end
local p, ttl, created, client = ARGV[9], tonumber(ARGV[4]), ARGV[3], ARGV[2]
local q = {tasks = ARGV[11], pending = ARGV[12]}
local n = tonumber(ARGV[17])
redis.call('HSET', KEYS[1], 'id', ARGV[1], 'client', client, 'total', n, 'created', created,
  'running', 0, 'ended', 0, 'succeeded', 0, 'failed', 0, 'cancelled', 0)
if ARGV[15] ~= '' then redis.call('HSET', KEYS[1], 'callback', ARGV[15]) end
redis.call('EXPIRE', KEYS[1], ttl)
redis.call('ZREMRANGEBYSCORE', KEYS[4], '-inf', created)
local free = n
local window = tonumber(ARGV[6])
if window > 0 then free = window - redis.call('ZCARD', KEYS[4]) end
if redis.call('LLEN', KEYS[5]) > 0 then free = 0 end
local ev = '{"seq":1,' .. string.sub(ARGV[5], 2)
local admitted = 0
for i = 0, n - 1 do
  local b = 18 + 8 * i
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
  if free > 0 then
    free = free - 1
    admitted = admitted + 1
    admit(p, q, id, cid, ARGV[b + 7], KEYS[4], ARGV[7], ARGV[8], ttl)
  else
    redis.call('HSET', run, 'task', ARGV[b + 7])
    redis.call('RPUSH', KEYS[5], id)
  end
end
redis.call('ZREMRANGEBYRANK', KEYS[3], 0, -1001)
redis.call('EXPIRE', KEYS[3], ttl)
redis.call('EXPIRE', KEYS[2], ttl)
redis.call('HSET', KEYS[6], 'limit', window, 'queue', ARGV[10], 'tasks', ARGV[11], 'pending', ARGV[12],
  'queues', ARGV[13])
redis.call('EXPIRE', KEYS[6], ttl)
if redis.call('LLEN', KEYS[5]) > 0 then
  redis.call('EXPIRE', KEYS[5], ttl)
  redis.call('SADD', KEYS[7], client)
end
if admitted > 0 then
  redis.call('LTRIM', p .. 'wake', 0, tonumber(ARGV[16]) - 1)
  redis.call('SADD', ARGV[13], ARGV[10])
end
if ARGV[14] ~= '' then redis.call('SET', KEYS[8], ARGV[1], 'EX', ttl) end
return {'created', ARGV[1], tostring(admitted)}
`)

// CreateBatch records a batch and its runs, admits what its window
// leaves room for and enqueues those that head their conversations, in
// one script. It returns the batch's id: an earlier batch's, with created
// false, when the idempotency key was used before.
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
	args := make([]any, 0, 17+8*len(nb.Runs))
	args = append(args, nb.ID, nb.Client, created, s.ttlSeconds(), ev, nb.Window,
		nb.CreatedAt.Add(activeRunHorizon).UnixMilli(), nb.CreatedAt.UnixNano(), prefix,
		q.Name, q.TaskKeyPrefix, q.PendingKey, q.QueuesKey, idem, nb.Callback, wakeCap, len(nb.Runs))
	for _, r := range nb.Runs {
		spec, err := json.Marshal(r.Spec)
		if err != nil {
			return "", false, err
		}
		started := ""
		if r.Callback.Started {
			started = "1"
		}
		args = append(args, r.Run.ID, r.Run.ConversationID, r.Run.Language, boolField(r.Run.Interactive),
			string(spec), r.Callback.URL, started, string(r.Task))
	}
	res, err := createBatchScript.Run(ctx, s.rdb, []string{batchKey(nb.ID), batchRunsKey(nb.ID),
		clientRunsKey(nb.Client), activeRunsKey(nb.Client), gateKey(nb.Client), gateConfKey(nb.Client), gatesKey,
		idemKey}, args...).StringSlice()
	if err != nil {
		return "", false, fmt.Errorf("create batch: %w", err)
	}
	if len(res) < 2 {
		return "", false, fmt.Errorf("create batch: unexpected reply %v", res)
	}
	return res[1], res[0] == "created", nil
}

func batchIdempotencyKey(client, key string) string {
	return prefix + "idem:" + client + ":batch:" + key
}

// letInScript lets runs of a client's gate in, oldest first, while the
// client's runs queued or running are fewer than the gate's limit. Runs
// no longer queued (cancelled while they waited) and those of a batch
// being cancelled are dropped from the gate. A gate still holding runs is
// kept ttl from now.
//
// KEYS[1] the gate, KEYS[2] its settings, KEYS[3] the client's runs
// queued or running, KEYS[4] clients with a gate
// ARGV[1] client, ARGV[2] now (unix ms), ARGV[3] when a run stops
// counting as queued or running should its end be lost (unix ms),
// ARGV[4] now (unix ns), ARGV[5] key prefix, ARGV[6] ttl (s),
// ARGV[7] most runs to let in, ARGV[8] most announcements kept
// Returns the number of runs let in.
var letInScript = redis.NewScript(admitLua + `
local conf = redis.call('HMGET', KEYS[2], 'limit', 'queue', 'tasks', 'pending', 'queues')
if not conf[2] then
  redis.call('DEL', KEYS[1])
  redis.call('SREM', KEYS[4], ARGV[1])
  return 0
end
local p = ARGV[5]
local q = {tasks = conf[3], pending = conf[4]}
local free = tonumber(ARGV[7])
redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', ARGV[2])
if tonumber(conf[1]) > 0 then free = math.min(free, tonumber(conf[1]) - redis.call('ZCARD', KEYS[3])) end
local released = 0
while free > 0 do
  local id = redis.call('LPOP', KEYS[1])
  if not id then break end
  local run = p .. 'run:{' .. id .. '}'
  local f = redis.call('HMGET', run, 'status', 'conversation', 'task', 'batch')
  if f[1] == 'queued' and f[3] and f[4] and redis.call('HGET', p .. 'batch:{' .. f[4] .. '}', 'cancelling') ~= '1' then
    redis.call('HDEL', run, 'task')
    admit(p, q, id, f[2], f[3], KEYS[3], ARGV[3], ARGV[4], ARGV[6])
    free = free - 1
    released = released + 1
  end
end
if redis.call('LLEN', KEYS[1]) == 0 then
  redis.call('SREM', KEYS[4], ARGV[1])
else
  redis.call('EXPIRE', KEYS[1], ARGV[6])
  redis.call('EXPIRE', KEYS[2], ARGV[6])
end
if released > 0 then
  redis.call('LTRIM', p .. 'wake', 0, tonumber(ARGV[8]) - 1)
  redis.call('SADD', conf[5], conf[2])
end
return released
`)

// release lets the runs of client's gate in that its limit leaves room
// for, and returns how many.
func (s *Batches) release(ctx context.Context, client string) (int, error) {
	now := s.now()
	n, err := letInScript.Run(ctx, s.rdb, []string{gateKey(client), gateConfKey(client), activeRunsKey(client), gatesKey},
		client, now.UnixMilli(), now.Add(activeRunHorizon).UnixMilli(), now.UnixNano(), prefix, s.ttlSeconds(),
		releaseMax, wakeCap).Int()
	if err != nil {
		return 0, fmt.Errorf("let in waiting runs of %s: %w", client, err)
	}
	return n, nil
}

// ReleaseGated lets in the waiting runs of every client with a gate that
// has room, and returns how many: the sweep's repair of a release a
// process did not make (it died between a run's end and the release).
func (s *Batches) ReleaseGated(ctx context.Context) (int, error) {
	clients, err := s.rdb.SMembers(ctx, gatesKey).Result()
	if err != nil {
		return 0, fmt.Errorf("read gated clients: %w", err)
	}
	total := 0
	for _, c := range clients {
		n, err := s.release(ctx, c)
		if err != nil {
			return total, err
		}
		total += n
	}
	return total, nil
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
