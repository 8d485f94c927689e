package store

import "github.com/redis/go-redis/v9"

// Events are stored as JSON objects without their seq; the scripts number
// them under the run's lock-free HINCRBY and splice the seq in front, so seq
// is assigned where the event is appended and can never repeat or skip.

// createScript records a new run and its queued event, and admits it to
// its conversation: runs of a conversation execute one at a time, in
// order, so only the conversation's head is enqueued; the others wait in
// its pending list until the head ends. A parallel run (ARGV[9] "1") takes
// no part in the order: it is enqueued at once, and noted in the set of
// parallel runs not yet claimed (KEYS[9]) for the sweep to enqueue again
// should its enqueueing be lost.
//
// KEYS[1] run hash, KEYS[2] event log, KEYS[3] the conversation's runs,
// KEYS[4] the conversation's head, KEYS[5] its pending list,
// KEYS[6] conversations with a head, KEYS[7] the client's recent runs,
// KEYS[8] the idempotency key (ignored when ARGV[8] is ""),
// KEYS[9] parallel runs not yet claimed
// ARGV[1] run id, ARGV[2] created (unix ms), ARGV[3] channel, ARGV[4] ttl (s),
// ARGV[5] queued event, ARGV[6] most runs waiting per conversation,
// ARGV[7] conversation id, ARGV[8] idempotency: "" or "1",
// ARGV[9] parallel: "" or "1", ARGV[10..] field/value pairs of the run hash.
// Returns {"enqueue"}, {"wait"}, {"busy"}, or {"exists", run id} when the
// idempotency key was used before.
var createScript = redis.NewScript(`
if ARGV[8] ~= '' then
  local prev = redis.call('GET', KEYS[8])
  if prev then return {'exists', prev} end
end
if redis.call('EXISTS', KEYS[1]) == 1 then return {'exists', ARGV[1]} end
if ARGV[9] == '' and redis.call('LLEN', KEYS[5]) >= tonumber(ARGV[6]) then return {'busy'} end
redis.call('HSET', KEYS[1], 'status', 'queued', 'seq', 1, unpack(ARGV, 10))
local ev = '{"seq":1,' .. string.sub(ARGV[5], 2)
redis.call('RPUSH', KEYS[2], ev)
redis.call('PUBLISH', ARGV[3], ev)
redis.call('ZADD', KEYS[3], ARGV[2], ARGV[1])
redis.call('ZADD', KEYS[7], ARGV[2], ARGV[1])
redis.call('ZREMRANGEBYRANK', KEYS[7], 0, -1001)
redis.call('EXPIRE', KEYS[7], ARGV[4])
redis.call('EXPIRE', KEYS[1], ARGV[4])
redis.call('EXPIRE', KEYS[2], ARGV[4])
redis.call('EXPIRE', KEYS[3], ARGV[4])
if ARGV[8] ~= '' then redis.call('SET', KEYS[8], ARGV[1], 'EX', ARGV[4]) end
if ARGV[9] ~= '' then
  redis.call('ZADD', KEYS[9], ARGV[2], ARGV[1])
  return {'enqueue'}
end
if redis.call('SET', KEYS[4], ARGV[1], 'NX') then
  redis.call('SADD', KEYS[6], ARGV[7])
  return {'enqueue'}
end
redis.call('RPUSH', KEYS[5], ARGV[1])
redis.call('EXPIRE', KEYS[5], ARGV[4])
return {'wait'}
`)

// transitionScript moves a run between statuses, updates its lease and
// fields, and appends events, all or nothing. When the run ends (ARGV[9]
// is "1"), its conversation moves on: if the run was the head, the next
// pending run becomes the head; if it was waiting, it leaves the list; and
// it leaves the conversation's live runs (KEYS[7]). A run that detaches
// (ARGV[9] is "d") moves its conversation on the same way but stays live.
//
// A run that reaches a final status from a live one is told of: its
// webhook, if it has a callback, is written to the outbox (notifyLua), and
// its batch, if it has one, counts it (batchEndLua) — in this script, so
// that whoever ends a run cannot end it without them.
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
// ARGV[10] "1" when the new status is final, ARGV[11] key prefix
// ARGV[12] n, the number of field/value pairs that follow
// ARGV[13 .. 12+2n] field/value pairs; ARGV[13+2n ..] events
// Returns {1, last seq, next head or ""} or {0, current status} when nothing
// was done.
var transitionScript = redis.NewScript(notifyLua + batchEndLua + `
local status = redis.call('HGET', KEYS[1], 'status')
if not status then return {0, ''} end
if ARGV[2] ~= '' and not string.find(' ' .. ARGV[2] .. ' ', ' ' .. status .. ' ', 1, true) then
  return {0, status}
end
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
local n = tonumber(ARGV[12])
for i = 0, n - 1 do
  redis.call('HSET', KEYS[1], ARGV[13 + 2 * i], ARGV[14 + 2 * i])
end
if ARGV[10] == '1' and (status == 'queued' or status == 'running') then
  local f = redis.call('HMGET', KEYS[1], 'callback', 'client', 'batch')
  if f[1] then notify(ARGV[11], ARGV[1], 'completed', 'run.completed', f[1], f[2] or '', now, ARGV[7]) end
  if f[3] then batchEnded(ARGV[11], f[3], status, ARGV[3], now, ARGV[7]) end
end
local seq = tonumber(redis.call('HGET', KEYS[1], 'seq'))
for i = 13 + 2 * n, #ARGV do
  seq = redis.call('HINCRBY', KEYS[1], 'seq', 1)
  local ev = '{"seq":' .. seq .. ',' .. string.sub(ARGV[i], 2)
  redis.call('RPUSH', KEYS[2], ev)
  redis.call('PUBLISH', ARGV[6], ev)
end
redis.call('EXPIRE', KEYS[1], ARGV[7])
redis.call('EXPIRE', KEYS[2], ARGV[7])
local nextRun = ''
if ARGV[9] == '1' then
  redis.call('HDEL', KEYS[7], ARGV[1])
  if redis.call('HLEN', KEYS[7]) <= 1 then redis.call('DEL', KEYS[7]) end
end
if ARGV[9] ~= '' then
  if redis.call('GET', KEYS[4]) == ARGV[1] then
    nextRun = redis.call('LPOP', KEYS[5])
    if nextRun then
      redis.call('SET', KEYS[4], nextRun)
    else
      nextRun = ''
      redis.call('DEL', KEYS[4])
      redis.call('SREM', KEYS[6], ARGV[8])
    end
  else
    redis.call('LREM', KEYS[5], 0, ARGV[1])
  end
end
return {1, seq, nextRun}
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
// asked to be told of starts has its webhook written (notifyLua).
//
// KEYS[1] run hash, KEYS[2] event log, KEYS[3] leases,
// KEYS[4] parallel runs not yet claimed
// ARGV[1] run id, ARGV[2] executor, ARGV[3] lease (ms), ARGV[4] channel,
// ARGV[5] ttl (s), ARGV[6] started event, ARGV[7] started (unix ms),
// ARGV[8] prefix of executors' heartbeat keys, ARGV[9] owner ttl (ms, 0:
// none), ARGV[10] key prefix
// Returns {1, seq, spec}, {0, current status} when the run is not queued
// (empty when there is none), or {2, executor, spec} when the conversation's
// runs live on that executor.
var claimScript = redis.NewScript(notifyLua + `
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
return {1, seq, spec}
`)

// advanceScript moves a conversation past a head that ended without going
// through transitionScript (it expired, or its end was recorded by a
// process that died before moving on).
//
// KEYS[1] the conversation's head, KEYS[2] its pending list,
// KEYS[3] conversations with a head
// ARGV[1] the head that ended, ARGV[2] conversation id
// Returns the new head, or "" when the conversation is idle or its head
// was not ARGV[1].
var advanceScript = redis.NewScript(`
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return '' end
local nextRun = redis.call('LPOP', KEYS[2])
if nextRun then
  redis.call('SET', KEYS[1], nextRun)
  return nextRun
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

// releaseDeadScript unregisters a dead executor and expires its runs' leases,
// unless it beat since it was found dead.
//
// KEYS[1] executors zset, KEYS[2] the executor's key, KEYS[3] leases
// ARGV[1] executor id, ARGV[2] its heartbeat's expiry when found dead,
// ARGV[3] a run's key before its id (the id is followed by '}')
// Returns {0} if it beat since, else {1, ids of the runs it held...}.
var releaseDeadScript = redis.NewScript(`
local beat = tonumber(redis.call('ZSCORE', KEYS[1], ARGV[1]) or '0')
if beat > tonumber(ARGV[2]) then return {0} end
redis.call('ZREM', KEYS[1], ARGV[1])
redis.call('DEL', KEYS[2])
local out = {1}
for _, id in ipairs(redis.call('ZRANGE', KEYS[3], 0, -1)) do
  if redis.call('HGET', ARGV[3] .. id .. '}', 'executor') == ARGV[1] then
    redis.call('ZADD', KEYS[3], 0, id)
    table.insert(out, id)
  end
end
return out
`)

// expiredScript lists runs whose lease has run out, by Redis's clock.
//
// KEYS[1] leases; ARGV[1] most ids to return.
var expiredScript = redis.NewScript(`
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
return redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', now, 'LIMIT', 0, tonumber(ARGV[1]))
`)

// heartbeatScript registers an executor as alive.
//
// KEYS[1] executors zset, KEYS[2] the executor's info
// ARGV[1] executor id, ARGV[2] info JSON, ARGV[3] ttl (ms)
var heartbeatScript = redis.NewScript(`
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
redis.call('ZADD', KEYS[1], now + tonumber(ARGV[3]), ARGV[1])
redis.call('SET', KEYS[2], ARGV[2], 'PX', ARGV[3])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - 3600000)
return 1
`)

// liveExecutorsScript returns the ids of executors whose heartbeat is
// current.
//
// KEYS[1] executors zset
var liveExecutorsScript = redis.NewScript(`
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
return redis.call('ZRANGEBYSCORE', KEYS[1], now, '+inf')
`)
