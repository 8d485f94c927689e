package store

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/runbox-dev/runbox"
	"github.com/runbox-dev/runbox/internal/store/internal/keys"
)

// Runs keeps runs and their conversations' queues: a run's record and
// event log, its admission to its conversation (only the head is
// enqueued; the others wait behind it), its claim by an executor and the
// lease that proves the executor alive, its end, and the cancellations
// and input clients send it. Its scripts are beside the methods that run
// them.
type Runs struct{ *base }

// Events are stored as JSON objects without their seq; the scripts number
// them under the run's lock-free HINCRBY and splice the seq in front, so seq
// is assigned where the event is appended and can never repeat or skip.

// createScript records a new run and its queued event, and admits it to
// its conversation: runs of a conversation execute one at a time, in
// order, so only the conversation's head is enqueued; the others wait in
// its pending list until the head ends. A head is enqueued when its
// client's turn allows, else it waits in its client's ready set
// (admissionLua's head). A parallel run (ARGV[9] "1") takes no part in
// the order: it is enqueued at once, and noted in the set of parallel
// runs not yet claimed (KEYS[9]) for the sweep to enqueue again should
// its enqueueing be lost. Nothing is written for a run past its client's
// bounds (admissionLua's room, and its seconds of the day).
//
// KEYS[1] run hash, KEYS[2] event log, KEYS[3] the conversation's runs,
// KEYS[4] the conversation's head, KEYS[5] its pending list,
// KEYS[6] conversations with a head, KEYS[7] the client's recent runs,
// KEYS[8] the idempotency key (ignored when ARGV[8] is ""),
// KEYS[9] parallel runs not yet claimed, KEYS[10] the client's runs
// queued or running, KEYS[11] the client's bounds
// ARGV[1] run id, ARGV[2] created (unix ms), ARGV[3] channel, ARGV[4] ttl (s),
// ARGV[5] queued event, ARGV[6] most runs waiting per conversation,
// ARGV[7] conversation id, ARGV[8] idempotency: "" or "1",
// ARGV[9] parallel: "" or "1", ARGV[10] key prefix, ARGV[11] client,
// ARGV[12] the bytes the run holds, ARGV[13..16] the client's bounds
// (most runs and bytes queued, concurrent runs, seconds a day),
// ARGV[17] today (the seconds' key suffix), ARGV[18] the seconds the
// run reserves, ARGV[19] when it stops counting as active should its
// end be lost (unix ms), ARGV[20..] field/value pairs of the run hash.
// Returns {"enqueue"}, {"ready"}, {"wait"}, {"busy"}, {"exists", run id}
// when the idempotency key was used before, or a refusal: {"full", what,
// have, limit} or {"seconds", used and reserved, asked}.
var createScript = redis.NewScript(admissionLua + `
if ARGV[8] ~= '' then
  local prev = redis.call('GET', KEYS[8])
  if prev then return {'exists', prev} end
end
if redis.call('EXISTS', KEYS[1]) == 1 then return {'exists', ARGV[1]} end
if ARGV[9] == '' and redis.call('LLEN', KEYS[5]) >= tonumber(ARGV[6]) then return {'busy'} end
local p, c, id, ttl, now = ARGV[10], ARGV[11], ARGV[1], tonumber(ARGV[4]), tonumber(ARGV[2])
local full = room(p, c, 1, tonumber(ARGV[12]), tonumber(ARGV[13]), tonumber(ARGV[14]))
if full then return full end
local perDay, secs = tonumber(ARGV[16]), tonumber(ARGV[18])
if perDay > 0 then
  local used, reserved = secondsLeft(p, c, ARGV[17])
  if used + reserved + secs > perDay then return {'seconds', tostring(used + reserved), tostring(secs)} end
  reserve(p, c, id, secs, ttl)
end
redis.call('HSET', KEYS[1], 'status', 'queued', 'seq', 1, unpack(ARGV, 20))
local ev = '{"seq":1,' .. string.sub(ARGV[5], 2)
redis.call('RPUSH', KEYS[2], ev)
redis.call('PUBLISH', ARGV[3], ev)
redis.call('ZADD', KEYS[3], now, id)
redis.call('ZADD', KEYS[7], now, id)
redis.call('ZREMRANGEBYRANK', KEYS[7], 0, -1001)
redis.call('EXPIRE', KEYS[7], ttl)
redis.call('EXPIRE', KEYS[1], ttl)
redis.call('EXPIRE', KEYS[2], ttl)
redis.call('EXPIRE', KEYS[3], ttl)
if ARGV[8] ~= '' then redis.call('SET', KEYS[8], id, 'EX', ttl) end
queue(p, c, id, tonumber(ARGV[12]), ttl)
redis.call('ZADD', KEYS[10], ARGV[19], id)
redis.call('PEXPIREAT', KEYS[10], ARGV[19])
redis.call('HSET', KEYS[11], 'concurrent', ARGV[15])
redis.call('EXPIRE', KEYS[11], ttl)
if ARGV[9] ~= '' then
  redis.call('ZADD', KEYS[9], now, id)
  return {'enqueue'}
end
if redis.call('SET', KEYS[4], id, 'NX') then
  redis.call('SADD', KEYS[6], ARGV[7])
  if head(p, c, id, now, ttl) then return {'enqueue'} end
  return {'ready'}
end
redis.call('RPUSH', KEYS[5], id)
redis.call('EXPIRE', KEYS[5], ttl)
return {'wait'}
`)

// transitionScript moves a run between statuses, updates its lease and
// fields, and appends events, all or nothing. When the run ends (ARGV[9]
// is "1"), its conversation moves on: if the run was the head, the next
// pending run becomes the head; if it was waiting, it leaves the list; and
// it leaves the conversation's live runs (KEYS[7]). A run that detaches
// (ARGV[9] is "d") moves its conversation on the same way but stays live.
// A conversation's new head is enqueued when its client's turn allows
// (admissionLua's head).
//
// A run that reaches a final status from a live one is told of: its
// webhook, if it has a callback, is written to the outbox (notifyLua), and
// its batch, if it has one, counts it (batchEndLua) — in this script, so
// that whoever ends a run cannot end it without them. It leaves its
// client's counts (admissionLua: its queue, its turn, its reservation,
// its runs queued or running), its seconds count on its client's day, and
// its spec, read no more, is dropped; what it leaves may let its client's
// next ready heads go.
//
// KEYS[1] run hash, KEYS[2] event log, KEYS[3] leases,
// KEYS[4] the conversation's head, KEYS[5] its pending list,
// KEYS[6] conversations with a head, KEYS[7] the conversation's live runs
// ARGV[1] run id
// ARGV[2] statuses the run must be in, space separated ("" = any)
// ARGV[3] new status ("" = unchanged)
// ARGV[4] lease operation: "set", "del", "expired" (only if the lease has
// expired, then del) or ""
// ARGV[5] lease length (ms) for "set"
// ARGV[6] channel, ARGV[7] ttl (s), ARGV[8] conversation id,
// ARGV[9] "1" when the run ends, "d" when it detaches, else ""
// ARGV[10] "1" when the new status is final, ARGV[11] key prefix,
// ARGV[12] the seconds the run took, ARGV[13] today (the seconds' key
// suffix)
// ARGV[14] n, the number of field/value pairs that follow
// ARGV[15 .. 14+2n] field/value pairs; ARGV[15+2n ..] events
// Returns {1, last seq, runs to enqueue...} or {0, current status} when
// nothing was done.
var transitionScript = redis.NewScript(notifyLua + batchEndLua + admissionLua + `
local f = redis.call('HMGET', KEYS[1], 'status', 'client', 'callback', 'batch')
local status, client = f[1], f[2] or 'default'
if not status then return {0, ''} end
if ARGV[2] ~= '' and not string.find(' ' .. ARGV[2] .. ' ', ' ' .. status .. ' ', 1, true) then
  return {0, status}
end
local p, ttl = ARGV[11], tonumber(ARGV[7])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
if ARGV[4] == 'expired' then
  local exp = redis.call('ZSCORE', KEYS[3], ARGV[1])
  if exp and tonumber(exp) > now then return {0, status} end
  redis.call('ZREM', KEYS[3], ARGV[1])
elseif ARGV[4] == 'set' then
  redis.call('ZADD', KEYS[3], now + tonumber(ARGV[5]), ARGV[1])
elseif ARGV[4] == 'del' then
  redis.call('ZREM', KEYS[3], ARGV[1])
end
if ARGV[3] ~= '' then redis.call('HSET', KEYS[1], 'status', ARGV[3]) end
local n = tonumber(ARGV[14])
for i = 0, n - 1 do
  redis.call('HSET', KEYS[1], ARGV[15 + 2 * i], ARGV[16 + 2 * i])
end
local out = {}
if ARGV[10] == '1' and (status == 'queued' or status == 'running') then
  if f[3] then notify(p, ARGV[1], 'completed', 'run.completed', f[3], client, now, ARGV[7]) end
  if f[4] then batchEnded(p, f[4], status, ARGV[3], now, ARGV[7]) end
  forget(p, client, ARGV[1])
  unreserve(p, client, ARGV[1])
  redis.call('ZREM', ckey(p, client, 'active'), ARGV[1])
  local secs = tonumber(ARGV[12])
  if secs > 0 then
    local day = ckey(p, client, 'runsec:' .. ARGV[13])
    redis.call('INCRBY', day, secs)
    redis.call('EXPIRE', day, 172800)
  end
  redis.call('HDEL', KEYS[1], 'spec')
  release(p, client, now, ttl, out)
end
local seq = tonumber(redis.call('HGET', KEYS[1], 'seq'))
for i = 15 + 2 * n, #ARGV do
  seq = redis.call('HINCRBY', KEYS[1], 'seq', 1)
  local ev = '{"seq":' .. seq .. ',' .. string.sub(ARGV[i], 2)
  redis.call('RPUSH', KEYS[2], ev)
  redis.call('PUBLISH', ARGV[6], ev)
end
redis.call('EXPIRE', KEYS[1], ttl)
redis.call('EXPIRE', KEYS[2], ttl)
if ARGV[9] == '1' then
  redis.call('HDEL', KEYS[7], ARGV[1])
  if redis.call('HLEN', KEYS[7]) <= 1 then redis.call('DEL', KEYS[7]) end
end
if ARGV[9] ~= '' then
  if redis.call('GET', KEYS[4]) == ARGV[1] then
    local nextRun = redis.call('LPOP', KEYS[5])
    if nextRun then
      redis.call('SET', KEYS[4], nextRun)
      if head(p, client, nextRun, now, ttl) then table.insert(out, 1, nextRun) end
    else
      redis.call('DEL', KEYS[4])
      redis.call('SREM', KEYS[6], ARGV[8])
    end
  else
    redis.call('LREM', KEYS[5], 0, ARGV[1])
  end
end
local reply = {1, seq}
for _, id in ipairs(out) do table.insert(reply, id) end
return reply
`)

// claimScript marks a queued run as running on an executor, with a lease,
// and logs its started event — unless its conversation has live runs on
// another executor whose heartbeat is current: runs of a conversation
// share its folder (and, with a remote file store, the executor's working
// copy of it), so while any is live they all run on one executor. The
// conversation's live runs hold that executor's id in the field
// "executor" and one field per run; the claim records the executor as the
// conversation's owner too, where the scheduler routes its next runs, and
// the run leaves the parallel runs not yet claimed (KEYS[4]).
//
// The conversation is the run's own (its record's "conversation"), so its
// two keys are named here from the key prefix: the executor learns it, and
// what to run, from the reply, without reading the run first.
//
// A run of a batch counts as running in it from here; a run whose client
// asked to be told of starts has its webhook written (notifyLua). The run
// leaves its client's queue and turn (admissionLua's forget), which may
// let the client's next ready heads go.
//
// KEYS[1] run hash, KEYS[2] event log, KEYS[3] leases,
// KEYS[4] parallel runs not yet claimed
// ARGV[1] run id, ARGV[2] executor, ARGV[3] lease (ms), ARGV[4] channel,
// ARGV[5] ttl (s), ARGV[6] started event, ARGV[7] started (unix ms),
// ARGV[8] prefix of executors' heartbeat keys, ARGV[9] owner ttl (ms, 0:
// none), ARGV[10] key prefix
// Returns {1, seq, spec, runs to enqueue...}, {0, current status} when the
// run is not queued (empty when there is none), or {2, executor, spec}
// when the conversation's runs live on that executor.
var claimScript = redis.NewScript(notifyLua + admissionLua + `
local f = redis.call('HMGET', KEYS[1], 'status', 'conversation', 'spec', 'batch', 'callback', 'notify_started', 'client')
local status, spec = f[1], f[3] or ''
if not status then return {0, ''} end
if status ~= 'queued' then return {0, status} end
local conv = ARGV[10] .. 'conv:' .. (f[2] or '')
local live, owner = conv .. ':live', conv .. ':owner'
local holder = redis.call('HGET', live, 'executor')
if holder and holder ~= ARGV[2] then
  if redis.call('HLEN', live) > 1 and redis.call('EXISTS', ARGV[8] .. holder) == 1 then
    return {2, holder, spec}
  end
  redis.call('DEL', live)
end
redis.call('HSET', live, 'executor', ARGV[2], ARGV[1], '1')
redis.call('EXPIRE', live, ARGV[5])
if tonumber(ARGV[9]) > 0 then redis.call('SET', owner, ARGV[2], 'PX', ARGV[9]) end
redis.call('ZREM', KEYS[4], ARGV[1])
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZADD', KEYS[3], now + tonumber(ARGV[3]), ARGV[1])
redis.call('HSET', KEYS[1], 'status', 'running', 'executor', ARGV[2], 'started', ARGV[7])
if f[4] then
  local batch = ARGV[10] .. 'batch:{' .. f[4] .. '}'
  if redis.call('EXISTS', batch) == 1 then
    redis.call('HINCRBY', batch, 'running', 1)
    redis.call('EXPIRE', batch, ARGV[5])
    redis.call('EXPIRE', batch .. ':runs', ARGV[5])
  end
end
if f[5] and f[6] == '1' then
  notify(ARGV[10], ARGV[1], 'started', 'run.started', f[5], f[7] or '', tonumber(ARGV[7]), ARGV[5])
end
local seq = redis.call('HINCRBY', KEYS[1], 'seq', 1)
local ev = '{"seq":' .. seq .. ',' .. string.sub(ARGV[6], 2)
redis.call('RPUSH', KEYS[2], ev)
redis.call('PUBLISH', ARGV[4], ev)
redis.call('EXPIRE', KEYS[1], ARGV[5])
redis.call('EXPIRE', KEYS[2], ARGV[5])
local reply = {1, seq, spec}
local client = f[7] or 'default'
forget(ARGV[10], client, ARGV[1])
local out = {}
release(ARGV[10], client, now, tonumber(ARGV[5]), out)
for _, id in ipairs(out) do table.insert(reply, id) end
return reply
`)

// advanceScript moves a conversation past a head that ended without going
// through transitionScript (it expired, or its end was recorded by a
// process that died before moving on).
//
// KEYS[1] the conversation's head, KEYS[2] its pending list,
// KEYS[3] conversations with a head
// ARGV[1] the head that ended, ARGV[2] conversation id, ARGV[3] key
// prefix, ARGV[4] now (unix ms), ARGV[5] ttl (s)
// Returns the new head when it is to be enqueued now (its client's turn,
// admissionLua's head), or "" when the conversation is idle, its head was
// not ARGV[1], or its new head waits its client's turn.
var advanceScript = redis.NewScript(admissionLua + `
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return '' end
local nextRun = redis.call('LPOP', KEYS[2])
if nextRun then
  redis.call('SET', KEYS[1], nextRun)
  local c = redis.call('HGET', ARGV[3] .. 'run:{' .. nextRun .. '}', 'client') or 'default'
  if head(ARGV[3], c, nextRun, tonumber(ARGV[4]), ARGV[5]) then return nextRun end
  return ''
end
redis.call('DEL', KEYS[1])
redis.call('SREM', KEYS[3], ARGV[2])
return ''
`)

// renewScript extends leases that still exist.
//
// KEYS[1] leases; ARGV[1] lease length (ms); ARGV[2..] run ids.
// Returns the ids that have no lease any more.
var renewScript = redis.NewScript(`
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local lost = {}
for i = 2, #ARGV do
  if redis.call('ZSCORE', KEYS[1], ARGV[i]) then
    redis.call('ZADD', KEYS[1], now + tonumber(ARGV[1]), ARGV[i])
  else
    table.insert(lost, ARGV[i])
  end
end
return lost
`)

// expiredScript lists runs whose lease has run out, by Redis's clock.
//
// KEYS[1] leases; ARGV[1] most ids to return.
var expiredScript = redis.NewScript(`
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
return redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, tonumber(ARGV[1]))
`)

// CreateRun records a new run, with its queued event, and admits it to its
// conversation (see createScript), or refuses it: busy past its
// conversation's waiting runs or its client's queue, quota_exceeded past
// its client's seconds of the day. With runbox.AdmitExists, the returned
// id is the earlier run's.
func (s *Runs) CreateRun(ctx context.Context, nr runbox.NewRun) (runbox.Admission, string, error) {
	run := nr.Run
	ev, err := eventBody(runbox.Event{TS: run.CreatedAt, Type: runbox.EventQueued})
	if err != nil {
		return 0, "", err
	}
	spec, err := json.Marshal(nr.Spec)
	if err != nil {
		return 0, "", err
	}
	idem, idemKey := "", prefix+"idem:-"
	if nr.IdempotencyKey != "" {
		idem, idemKey = "1", idempotencyKey(nr.Client, nr.IdempotencyKey)
	}
	cid := run.ConversationID
	created := run.CreatedAt.UnixMilli()
	parallel := ""
	if nr.Parallel {
		parallel = "1"
	}
	client := cmp.Or(nr.Client, runbox.DefaultClient)
	args := []any{run.ID, created, keys.Channel(run.ID), s.ttlSeconds(), ev, max(nr.MaxWaiting, 1), cid, idem, parallel,
		prefix, client, len(spec) + recordOverhead}
	args = append(args, boundsArgs(nr.Bounds)...)
	args = append(args, dayKey(s.now()), nr.Spec.TimeoutSeconds, run.CreatedAt.Add(activeRunHorizon).UnixMilli(),
		"id", run.ID, "conversation", cid, "language", run.Language,
		"created", created, "interactive", boolField(run.Interactive), specField, string(spec), "client", client)
	if cb := nr.Callback; cb.URL != "" {
		args = append(args, "callback", cb.URL)
		if cb.Started {
			args = append(args, "notify_started", "1")
		}
	}
	res, err := createScript.Run(ctx, s.rdb, []string{
		keys.Run(run.ID), keys.Events(run.ID), conversationRunsKey(cid), conversationHeadKey(cid),
		conversationPendingKey(cid), busyConvsKey, clientRunsKey(client), idemKey,
		parallelKey, activeRunsKey(client), boundsKey(client),
	}, args...).StringSlice()
	if err != nil {
		return 0, "", fmt.Errorf("create run: %w", err)
	}
	switch res[0] {
	case "enqueue":
		return runbox.AdmitEnqueue, run.ID, nil
	case "ready":
		return runbox.AdmitReady, run.ID, nil
	case "wait":
		return runbox.AdmitWait, run.ID, nil
	case "exists":
		return runbox.AdmitExists, res[1], nil
	case "busy":
		return 0, "", runbox.ErrBusy
	}
	return 0, "", refusal(res, nr.Bounds)
}

// Spec returns what a run was asked to do.
func (s *Runs) Spec(ctx context.Context, id string) (runbox.Spec, error) {
	var spec runbox.Spec
	b, err := s.rdb.HGet(ctx, keys.Run(id), specField).Bytes()
	if errors.Is(err, redis.Nil) {
		return spec, runbox.ErrRunNotFound
	}
	if err != nil {
		return spec, fmt.Errorf("read run %s: %w", id, err)
	}
	if err := json.Unmarshal(b, &spec); err != nil {
		return spec, fmt.Errorf("read run %s: spec: %w", id, err)
	}
	return spec, nil
}

// Transition describes a change of a run's state.
type Transition struct {
	From   []runbox.Status // the run must be in one of these; none = any
	To     runbox.Status   // "" = unchanged
	Lease  runbox.LeaseOp
	Fields map[string]string
	Events []runbox.Event
	// Conversation is the run's; when To is final, the conversation moves
	// on to its next run.
	Conversation string
	// Detach moves the conversation on to its next run although the run
	// goes on (see Detach).
	Detach bool
	// Took is how long the run ran, counted on its client's day when To
	// is final.
	Took time.Duration
}

// Apply carries out t atomically.
func (s *Runs) Apply(ctx context.Context, id string, t Transition, lease time.Duration) (runbox.Applied, error) {
	from := make([]string, len(t.From))
	for i, st := range t.From {
		from[i] = string(st)
	}
	op := [...]string{runbox.LeaseKeep: "", runbox.LeaseSet: "set", runbox.LeaseDelete: "del", runbox.LeaseExpired: "expired"}[t.Lease]
	ends := ""
	switch {
	case t.Conversation == "":
	case t.To != "" && t.To.Final():
		ends = "1"
	case t.Detach:
		ends = "d"
	}
	final := ""
	if t.To != "" && t.To.Final() {
		final = "1"
	}
	secs := int64((t.Took + time.Second - 1) / time.Second)
	args := []any{id, strings.Join(from, " "), string(t.To), op, lease.Milliseconds(),
		keys.Channel(id), s.ttlSeconds(), t.Conversation, ends, final, prefix, secs, dayKey(s.now()), len(t.Fields)}
	for k, v := range t.Fields {
		args = append(args, k, v)
	}
	for _, ev := range t.Events {
		b, err := eventBody(ev)
		if err != nil {
			return runbox.Applied{}, err
		}
		args = append(args, b)
	}
	cid := t.Conversation
	res, err := transitionScript.Run(ctx, s.rdb, []string{keys.Run(id), keys.Events(id), leasesKey,
		conversationHeadKey(cid), conversationPendingKey(cid), busyConvsKey, conversationLiveKey(cid)}, args...).Slice()
	if err != nil {
		return runbox.Applied{}, fmt.Errorf("update run %s: %w", id, err)
	}
	if len(res) < 2 {
		return runbox.Applied{}, fmt.Errorf("update run %s: unexpected reply %v", id, res)
	}
	if ok, _ := res[0].(int64); ok == 1 {
		return runbox.Applied{Done: true, Dispatch: replyIDs(res[2:])}, nil
	}
	st, _ := res[1].(string)
	if st == "" {
		return runbox.Applied{}, runbox.ErrRunNotFound
	}
	return runbox.Applied{Status: runbox.Status(st)}, nil
}

// Claim marks a queued run as running on executor, with a lease, and logs
// its started event. It reports false when the run is not queued: it was
// cancelled, or it already ran and must not run again.
func (s *Runs) Claim(ctx context.Context, id, executor string, lease time.Duration) (bool, error) {
	c, err := s.ClaimFor(ctx, id, executor, lease, 0)
	return c.OK, err
}

// ClaimFor claims a queued run as Claim does, and keeps a conversation's
// live runs on one executor: while another live executor runs some of the
// run's conversation's, the run is not claimed and Elsewhere names that
// executor. A claim records executor as the conversation's owner for
// ownerTTL (none if 0), so that the conversation's next runs are routed to
// it. One round trip: the run's Spec comes back with the claim.
func (s *Runs) ClaimFor(ctx context.Context, id, executor string, lease, ownerTTL time.Duration) (runbox.Claimed, error) {
	now := s.now()
	ev, err := eventBody(runbox.Event{TS: now, Type: runbox.EventStarted})
	if err != nil {
		return runbox.Claimed{}, err
	}
	res, err := claimScript.Run(ctx, s.rdb, []string{keys.Run(id), keys.Events(id), leasesKey, parallelKey},
		id, executor, lease.Milliseconds(), keys.Channel(id), s.ttlSeconds(), ev, now.UnixMilli(), executorKey(""),
		ownerTTL.Milliseconds(), prefix).Slice()
	if err != nil {
		return runbox.Claimed{}, fmt.Errorf("claim run %s: %w", id, err)
	}
	if len(res) < 2 {
		return runbox.Claimed{}, fmt.Errorf("claim run %s: unexpected reply %v", id, res)
	}
	var c runbox.Claimed
	code, _ := res[0].(int64)
	switch code {
	case 1:
		c.OK = true
	case 2:
		c.Elsewhere, _ = res[1].(string)
	default:
		st, _ := res[1].(string)
		return runbox.Claimed{Status: runbox.Status(st)}, nil
	}
	var spec string
	if len(res) > 2 {
		spec, _ = res[2].(string)
		c.Dispatch = replyIDs(res[3:])
	}
	if err := json.Unmarshal([]byte(spec), &c.Spec); err != nil {
		// Claimed all the same, with what to run unknown: its lease
		// lapses, and the watchdog ends it as lost.
		return c, fmt.Errorf("claim run %s: spec: %w", id, err)
	}
	return c, nil
}

// Detach records that a running run has left its conversation's order
// (its program runs on, holding no place in it): the conversation's next
// run may start beside it. It logs a detached event and returns the run
// that now heads the conversation if it is to be enqueued (none while it
// waits its client's turn).
func (s *Runs) Detach(ctx context.Context, id, cid string) ([]string, error) {
	a, err := s.Apply(ctx, id, Transition{
		From:         []runbox.Status{runbox.StatusRunning},
		Fields:       map[string]string{"detached": "1"},
		Events:       []runbox.Event{{TS: s.now(), Type: runbox.EventDetached}},
		Conversation: cid,
		Detach:       true,
	}, 0)
	if err != nil {
		return nil, err
	}
	if !a.Done {
		return nil, fmt.Errorf("detach run %s: run is %s", id, a.Status)
	}
	return a.Dispatch, nil
}

// StaleParallel returns parallel runs created before cutoff that no
// executor has claimed yet, up to n: their enqueueing may have been lost.
func (s *Runs) StaleParallel(ctx context.Context, cutoff time.Time, n int) ([]string, error) {
	ids, err := s.rdb.ZRangeByScore(ctx, parallelKey, &redis.ZRangeBy{
		Min: "-inf", Max: strconv.FormatInt(cutoff.UnixMilli(), 10), Count: int64(n),
	}).Result()
	if err != nil {
		return nil, fmt.Errorf("read parallel runs: %w", err)
	}
	return ids, nil
}

// ForgetParallel drops runs from the parallel runs not yet claimed: they
// ended without being claimed (cancelled), or expired.
func (s *Runs) ForgetParallel(ctx context.Context, ids ...string) error {
	if len(ids) == 0 {
		return nil
	}
	if err := s.rdb.ZRem(ctx, parallelKey, ids).Err(); err != nil {
		return fmt.Errorf("forget parallel runs: %w", err)
	}
	return nil
}

// Append logs events of a running run.
func (s *Runs) Append(ctx context.Context, id string, evs ...runbox.Event) error {
	a, err := s.Apply(ctx, id, Transition{From: []runbox.Status{runbox.StatusRunning}, Events: evs}, 0)
	if err != nil {
		return err
	}
	if !a.Done {
		return fmt.Errorf("append to run %s: run is %s", id, a.Status)
	}
	return nil
}

// Finish ends a run with its result, logging the events and then done, and
// moves its conversation on. It returns the transition's outcome: Done is
// false when another party ended the run first; Next is the run to enqueue.
//
// The result is stored once, in the run's record: the done event is logged
// and published without it, and Events and watches put it back.
func (s *Runs) Finish(ctx context.Context, id string, e runbox.Ending) (runbox.Applied, error) {
	b, err := encodeResult(e.Result)
	if err != nil {
		return runbox.Applied{}, err
	}
	now := s.now()
	evs := append(slices.Clip(e.Events), runbox.Event{TS: now, Type: runbox.EventDone})
	var took time.Duration
	if e.Result != nil {
		took = time.Duration(e.Result.DurationMS) * time.Millisecond
	}
	return s.Apply(ctx, id, Transition{
		From:         e.From,
		To:           e.Status,
		Lease:        e.Lease,
		Fields:       map[string]string{"result": string(b), "finished": strconv.FormatInt(now.UnixMilli(), 10)},
		Events:       evs,
		Conversation: e.Conversation,
		Took:         took,
	}, 0)
}

// Run returns a run's record.
func (s *Runs) Run(ctx context.Context, id string) (runbox.Run, error) {
	m, err := s.rdb.HGetAll(ctx, keys.Run(id)).Result()
	if err != nil {
		return runbox.Run{}, fmt.Errorf("read run %s: %w", id, err)
	}
	return parseRun(m)
}

// parseRun reads a run's record from its hash.
func parseRun(m map[string]string) (runbox.Run, error) {
	if len(m) == 0 || m["status"] == "" {
		return runbox.Run{}, runbox.ErrRunNotFound
	}
	var err error
	run := runbox.Run{
		ID:             m["id"],
		ConversationID: m["conversation"],
		Language:       m["language"],
		Status:         runbox.Status(m["status"]),
		Interactive:    m["interactive"] == "1",
		CreatedAt:      msTime(m["created"]),
		StartedAt:      msTime(m["started"]),
		FinishedAt:     msTime(m["finished"]),
	}
	if r := m["result"]; r != "" {
		if run.Result, err = decodeResult([]byte(r)); err != nil {
			return runbox.Run{}, fmt.Errorf("read run %s: result: %w", run.ID, err)
		}
	}
	return run, nil
}

// encodeResult is how a result is kept: without Output, which is Stdout
// then Stderr, so that the program's output is not stored twice.
func encodeResult(r *runbox.Result) ([]byte, error) {
	if r == nil {
		return []byte("null"), nil
	}
	kept := *r
	kept.Output = ""
	return json.Marshal(kept)
}

func decodeResult(b []byte) (*runbox.Result, error) {
	var r *runbox.Result
	if err := json.Unmarshal(b, &r); err != nil || r == nil {
		return nil, err
	}
	r.Output = r.Stdout + r.Stderr
	return r, nil
}

// Executor returns the id of the executor a run was claimed by.
func (s *Runs) Executor(ctx context.Context, id string) (string, error) {
	v, err := s.rdb.HGet(ctx, keys.Run(id), "executor").Result()
	if errors.Is(err, redis.Nil) {
		return "", nil
	}
	return v, err
}

// Events returns a run's events with seq greater than after, in order.
//
// The done event is stored without the run's result, which its record
// holds: it is read in the same round trip, and put back. (It is set with
// the done event, atomically: a log that holds done finds it. Before the
// end there is none to read.)
func (s *Runs) Events(ctx context.Context, id string, after int64) ([]runbox.Event, error) {
	pipe := s.rdb.Pipeline()
	list := pipe.LRange(ctx, keys.Events(id), after, -1)
	result := pipe.HGet(ctx, keys.Run(id), "result")
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return nil, fmt.Errorf("read events of %s: %w", id, err)
	}
	raw := list.Val()
	evs := make([]runbox.Event, 0, len(raw))
	for _, r := range raw {
		var ev runbox.Event
		if err := json.Unmarshal([]byte(r), &ev); err != nil {
			return nil, fmt.Errorf("read events of %s: %w", id, err)
		}
		if ev.Type == runbox.EventDone && ev.Result == nil && result.Err() == nil {
			res, err := decodeResult([]byte(result.Val()))
			if err != nil {
				return nil, fmt.Errorf("read result of %s: %w", id, err)
			}
			ev.Result = res
		}
		evs = append(evs, ev)
	}
	return evs, nil
}

// RenewLeases extends the leases of running runs and returns the ids whose
// lease is gone: someone declared those runs dead, so their executor must
// stop them.
func (s *Runs) RenewLeases(ctx context.Context, lease time.Duration, ids ...string) ([]string, error) {
	if len(ids) == 0 {
		return nil, nil
	}
	args := make([]any, 0, len(ids)+1)
	args = append(args, lease.Milliseconds())
	for _, id := range ids {
		args = append(args, id)
	}
	lost, err := renewScript.Run(ctx, s.rdb, []string{leasesKey}, args...).StringSlice()
	if err != nil {
		return nil, fmt.Errorf("renew leases: %w", err)
	}
	return lost, nil
}

// ExpiredLeases returns up to n runs whose lease ran out.
func (s *Runs) ExpiredLeases(ctx context.Context, n int) ([]string, error) {
	ids, err := expiredScript.Run(ctx, s.rdb, []string{leasesKey}, n).StringSlice()
	if err != nil {
		return nil, fmt.Errorf("read expired leases: %w", err)
	}
	return ids, nil
}

// staleHeadsScript looks at conversations with a head, as the sweep
// does, in one round trip for many: a conversation whose head is gone
// leaves the set; a head whose run is gone or ended is returned "ended";
// a head queued since before ARGV[2] is returned "queued" when it was
// given to the executors (its enqueueing may have been lost) — not while
// it waits its client's turn; one neither given nor waiting (it headed
// its conversation before a crash) is admitted as a head now
// (admissionLua's head), and returned if given.
//
// KEYS: none (the conversations' keys are named from ARGV[1]).
// ARGV[1] key prefix, ARGV[2] cutoff (unix ms), ARGV[3] now (unix ms),
// ARGV[4] ttl (s), ARGV[5..] conversation ids
// Returns {what, conversation, run, ...} in threes.
var staleHeadsScript = redis.NewScript(admissionLua + `
local p, cutoff, now = ARGV[1], tonumber(ARGV[2]), tonumber(ARGV[3])
local out = {}
for i = 5, #ARGV do
  local cid = ARGV[i]
  local id = redis.call('GET', p .. 'conv:' .. cid .. ':head')
  if not id then
    redis.call('SREM', p .. 'convs:busy', cid)
  else
    local f = redis.call('HMGET', p .. 'run:{' .. id .. '}', 'status', 'created', 'client')
    local st = f[1]
    if st ~= 'queued' and st ~= 'running' then
      table.insert(out, 'ended'); table.insert(out, cid); table.insert(out, id)
    elseif st == 'queued' and tonumber(f[2] or '0') < cutoff then
      local c = f[3] or 'default'
      local given = redis.call('ZSCORE', ckey(p, c, 'dispatched'), id)
      if not given and not redis.call('ZSCORE', ckey(p, c, 'ready'), id) then
        given = head(p, c, id, now, ARGV[4])
      end
      if given then table.insert(out, 'queued'); table.insert(out, cid); table.insert(out, id) end
    end
  end
end
return out
`)

// StaleHeads returns the conversations' heads the sweep must act on:
// those whose run ended without their conversation moving on, and those
// given to the executors before cutoff and still queued (see
// staleHeadsScript). It reads the conversations a page at a time, a round
// trip each.
func (s *Runs) StaleHeads(ctx context.Context, cutoff time.Time) ([]runbox.StaleHead, error) {
	var out []runbox.StaleHead
	var cursor uint64
	for {
		cids, next, err := s.rdb.SScan(ctx, busyConvsKey, cursor, "", 200).Result()
		if err != nil {
			return nil, fmt.Errorf("read conversation heads: %w", err)
		}
		if len(cids) > 0 {
			args := []any{prefix, cutoff.UnixMilli(), s.now().UnixMilli(), s.ttlSeconds()}
			for _, c := range cids {
				args = append(args, c)
			}
			res, err := staleHeadsScript.Run(ctx, s.rdb, nil, args...).StringSlice()
			if err != nil && !errors.Is(err, redis.Nil) {
				return nil, fmt.Errorf("read conversation heads: %w", err)
			}
			for i := 0; i+2 < len(res); i += 3 {
				out = append(out, runbox.StaleHead{Ended: res[i] == "ended",
					ConversationHead: runbox.ConversationHead{Conversation: res[i+1], Run: res[i+2]}})
			}
		}
		if cursor = next; cursor == 0 {
			return out, nil
		}
	}
}

// Advance moves a conversation past head, which ended, and returns the run
// that heads it now if it is to be enqueued ("" if none, or while it waits
// its client's turn). It does nothing if head is not the head.
func (s *Runs) Advance(ctx context.Context, h runbox.ConversationHead) (string, error) {
	next, err := advanceScript.Run(ctx, s.rdb, []string{
		conversationHeadKey(h.Conversation), conversationPendingKey(h.Conversation), busyConvsKey,
	}, h.Run, h.Conversation, prefix, s.now().UnixMilli(), s.ttlSeconds()).Text()
	if err != nil {
		return "", fmt.Errorf("advance conversation %s: %w", h.Conversation, err)
	}
	return next, nil
}

// RecentRuns returns up to n runs, newest first: those of the conversation key
// cid, or with cid "", the client's most recent.
func (s *Runs) RecentRuns(ctx context.Context, client, cid string, n int) ([]runbox.Run, error) {
	return s.RunsWhere(ctx, client, cid, n, nil)
}

// RunsWhere is Runs of the runs keep keeps (nil: all): it reads on, past
// the runs left out, until it has n or there are no more.
func (s *Runs) RunsWhere(ctx context.Context, client, cid string, n int, keep func(runbox.Run) bool) ([]runbox.Run, error) {
	key := clientRunsKey(client)
	if cid != "" {
		key = conversationRunsKey(cid)
	}
	runs := make([]runbox.Run, 0, n)
	for start := int64(0); len(runs) < n; start += int64(n) {
		ids, err := s.rdb.ZRevRange(ctx, key, start, start+int64(n)-1).Result()
		if err != nil {
			return nil, fmt.Errorf("list runs: %w", err)
		}
		for _, id := range ids {
			run, err := s.Run(ctx, id)
			if errors.Is(err, runbox.ErrRunNotFound) {
				continue // expired
			}
			if err != nil {
				return nil, err
			}
			if keep != nil && !keep(run) {
				continue
			}
			run.Result = nil
			if runs = append(runs, run); len(runs) == n {
				break
			}
		}
		if len(ids) < n {
			break
		}
	}
	return runs, nil
}

// Values of a run's cancel flag; a graceful request's message carries
// termSuffix after the run id.
const (
	cancelKill = "1"
	cancelTerm = "term"
	termSuffix = " " + cancelTerm
)

// RequestCancel flags a run for cancellation and tells the executors, one
// of which may be running it.
func (s *Runs) RequestCancel(ctx context.Context, id string, graceful bool) error {
	flag, msg := cancelKill, id
	if graceful {
		flag, msg = cancelTerm, id+termSuffix
	}
	pipe := s.rdb.TxPipeline()
	pipe.HSet(ctx, keys.Run(id), cancelFlagField, flag)
	pipe.Publish(ctx, cancelChannel, msg)
	if _, err := pipe.Exec(ctx); err != nil {
		return fmt.Errorf("cancel run %s: %w", id, err)
	}
	return nil
}

// ParseCancel reads a message of SubscribeCancels.
func ParseCancel(msg string) runbox.CancelRequest {
	id, graceful := strings.CutSuffix(msg, termSuffix)
	return runbox.CancelRequest{ID: id, Graceful: graceful}
}

// CancelRequested reports which of ids were flagged for cancellation.
func (s *Runs) CancelRequested(ctx context.Context, ids ...string) ([]runbox.CancelRequest, error) {
	pipe := s.rdb.Pipeline()
	cmds := make([]*redis.StringCmd, len(ids))
	for i, id := range ids {
		cmds[i] = pipe.HGet(ctx, keys.Run(id), cancelFlagField)
	}
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return nil, fmt.Errorf("read cancel flags: %w", err)
	}
	var out []runbox.CancelRequest
	for i, c := range cmds {
		if v := c.Val(); v == cancelKill || v == cancelTerm {
			out = append(out, runbox.CancelRequest{ID: ids[i], Graceful: v == cancelTerm})
		}
	}
	return out, nil
}

// SubscribeCancels returns a subscription to cancellation requests, once
// Redis confirmed it; each message is one ParseCancel reads. The caller
// closes it.
func (s *Runs) SubscribeCancels(ctx context.Context) (*Subscription, error) {
	return s.conn.subscribe(ctx, cancelChannel)
}

// eventBody encodes an event for the scripts, which add its seq.
func eventBody(ev runbox.Event) (string, error) {
	ev.Seq = 0
	b, err := json.Marshal(ev)
	if err != nil {
		return "", fmt.Errorf("encode event: %w", err)
	}
	return string(b), nil
}

func boolField(b bool) string {
	if b {
		return "1"
	}
	return "0"
}

func msTime(v string) time.Time {
	ms, err := strconv.ParseInt(v, 10, 64)
	if err != nil || ms == 0 {
		return time.Time{}
	}
	return time.UnixMilli(ms).UTC()
}
