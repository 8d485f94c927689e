package store

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/runbox-dev/runbox"
)

// One client must not be able to take the service from the others. What
// a client has waiting is bounded, what it may spend is reserved before
// it runs, and the executors' free slots go round the clients — all held
// by the scripts that record, claim and end runs (createScript,
// createBatchScript, claimScript, transitionScript), with the functions
// of admissionLua, so that no crash between two steps leaves a count
// wrong for longer than the sweep takes to mend it (Reconcile).
//
// Waiting. Every run is counted in its client's queue from its record to
// its claim (or its end, if it never starts): the hash
// runbox:client:<c>:queued holds each run's bytes (its spec, its stored
// task and recordOverhead) and runbox:client:<c>:queued:total their sum.
// A run or batch past the client's runbox.ClientBounds is refused whole,
// before anything is written.
//
// Spending. A client whose tier has run_seconds_per_day reserves each
// run's timeout as the run is recorded (runbox:client:<c>:runsec:reserved,
// a hash of run → seconds, and its :total): a run is admitted only while
// the seconds used today and those reserved leave room for it. Its end
// gives its reservation back and counts what it took.
//
// Dispatch. Only the head of each conversation is ever given to asynq
// (Runs), and of those, a client has at most dispatchAhead given and not
// yet claimed (runbox:client:<c>:dispatched), fewer while it has its
// concurrent_runs claimed; its other heads wait, in the order they came
// (numbered by runbox:client:<c>:ready:seq), in runbox:client:<c>:ready. A claim or an end of a client's run lets
// its next ready head go. asynq's queues hold at most dispatchAhead heads
// of each client, in the order they were let go: a free slot takes the
// oldest, and a client's next is let go only once its last was taken, so
// the slots go round the clients with work, whoever queued thousands.

// dispatchAhead is how many runs of one client may wait in asynq's queues
// unclaimed. One is the fairest (a free slot never passes over another
// client for more than one of this client's runs); two keeps a slot that
// frees from waiting for the round trip that lets a client's next run go.
const dispatchAhead = 2

// recordOverhead is what a run costs Redis besides its spec and task
// while it waits: its record's other fields, its queued event, its place
// in its conversation and its client's lists (measured: TestQueuedBytes).
const recordOverhead = 2048

func queuedKey(client string) string { return prefix + "client:" + client + ":queued" }

func reservedKey(client string) string { return prefix + "client:" + client + ":runsec:reserved" }

// Clients with runs in their queued hash, or heads in their ready set:
// those Reconcile looks at.
const (
	queuedClientsKey = prefix + "clients:queued"
	readyClientsKey  = prefix + "clients:ready"
)

// admissionLua defines the functions the run scripts share (p is the key
// prefix, c a client, id a run, now unix ms, ttl seconds):
//
//   - room(p, c, n, bytes, maxRuns, maxBytes): nil when n more runs of
//     bytes in all fit c's queue, else {'full', what, have, limit};
//   - tally(h, id, n, ttl) / untally(h, id): count id's n once in the hash
//     h and their sum in h:total, or no longer;
//   - queue(p, c, id, bytes, ttl) / unqueue(p, c, id): count a run
//     waiting, or no longer;
//   - secondsLeft(p, c, day): c's seconds used on day (its counter's key
//     suffix) and those reserved; reserve(p, c, id, secs, ttl) /
//     unreserve(p, c, id);
//   - head(p, c, id, now, ttl): a run now heads its conversation; it is
//     dispatched (true) or waits in c's ready set (false);
//   - release(p, c, now, ttl, out): lets c's ready heads go while it may
//     dispatch, appending them to out;
//   - forget(p, c, id): the run is queued no more (claimed, or ended).
var admissionLua = `
local AHEAD = ` + strconv.Itoa(dispatchAhead) + `
local function ckey(p, c, s) return p .. 'client:' .. c .. ':' .. s end
local function room(p, c, n, bytes, maxRuns, maxBytes)
  local q = ckey(p, c, 'queued')
  if maxRuns > 0 then
    local have = redis.call('HLEN', q)
    if have + n > maxRuns then return {'full', 'runs', tostring(have), tostring(maxRuns)} end
  end
  if maxBytes > 0 then
    local have = tonumber(redis.call('GET', q .. ':total') or '0')
    if have + bytes > maxBytes then return {'full', 'bytes', tostring(have), tostring(maxBytes)} end
  end
  return nil
end
local function tally(h, id, n, ttl)
  if redis.call('HSETNX', h, id, n) == 1 then redis.call('INCRBY', h .. ':total', n) end
  redis.call('EXPIRE', h, ttl)
  redis.call('EXPIRE', h .. ':total', ttl)
end
local function untally(h, id)
  local n = redis.call('HGET', h, id)
  if n then
    redis.call('HDEL', h, id)
    redis.call('DECRBY', h .. ':total', n)
  end
end
local function queue(p, c, id, bytes, ttl)
  tally(ckey(p, c, 'queued'), id, bytes, ttl)
  redis.call('SADD', p .. 'clients:queued', c)
end
local function unqueue(p, c, id) untally(ckey(p, c, 'queued'), id) end
local function secondsLeft(p, c, day)
  local used = tonumber(redis.call('GET', ckey(p, c, 'runsec:' .. day)) or '0')
  local reserved = tonumber(redis.call('GET', ckey(p, c, 'runsec:reserved:total')) or '0')
  return used, reserved
end
local function reserve(p, c, id, secs, ttl) tally(ckey(p, c, 'runsec:reserved'), id, secs, ttl) end
local function unreserve(p, c, id) untally(ckey(p, c, 'runsec:reserved'), id) end
local function mayDispatch(p, c, now)
  local n = redis.call('ZCARD', ckey(p, c, 'dispatched'))
  if n >= AHEAD then return false end
  local conc = tonumber(redis.call('HGET', ckey(p, c, 'bounds'), 'concurrent') or '0')
  if conc > 0 then
    local active = ckey(p, c, 'active')
    redis.call('ZREMRANGEBYSCORE', active, '-inf', now)
    local running = redis.call('ZCARD', active) - redis.call('HLEN', ckey(p, c, 'queued'))
    if math.max(running, 0) + n >= conc then return false end
  end
  return true
end
local function dispatch(p, c, id, now, ttl)
  local d = ckey(p, c, 'dispatched')
  redis.call('ZADD', d, now, id)
  redis.call('EXPIRE', d, ttl)
end
local function head(p, c, id, now, ttl)
  if mayDispatch(p, c, now) then
    dispatch(p, c, id, now, ttl)
    return true
  end
  local r = ckey(p, c, 'ready')
  if not redis.call('ZSCORE', r, id) then
    redis.call('ZADD', r, redis.call('INCR', r .. ':seq'), id)
  end
  redis.call('EXPIRE', r, ttl)
  redis.call('EXPIRE', r .. ':seq', ttl)
  redis.call('SADD', p .. 'clients:ready', c)
  return false
end
local function release(p, c, now, ttl, out)
  local r = ckey(p, c, 'ready')
  while mayDispatch(p, c, now) do
    local popped = redis.call('ZPOPMIN', r)
    if #popped == 0 then break end
    local id = popped[1]
    if redis.call('HGET', p .. 'run:{' .. id .. '}', 'status') == 'queued' then
      dispatch(p, c, id, now, ttl)
      table.insert(out, id)
    end
  end
  if redis.call('ZCARD', r) == 0 then redis.call('SREM', p .. 'clients:ready', c) end
end
local function forget(p, c, id)
  local was = redis.call('ZREM', ckey(p, c, 'dispatched'), id) + redis.call('ZREM', ckey(p, c, 'ready'), id)
  unqueue(p, c, id)
  return was > 0
end
`

// boundsKey holds what the scripts that claim and end a client's runs
// must know of its tier (its concurrent_runs), written as its runs are
// recorded.
func boundsKey(client string) string { return prefix + "client:" + client + ":bounds" }

// boundsArgs are a client's bounds as the create scripts take them.
func boundsArgs(b runbox.ClientBounds) []any {
	return []any{b.MaxQueuedRuns, b.MaxQueuedBytes, b.ConcurrentRuns, b.RunSecondsPerDay}
}

// refusal turns a create script's refusal into the client's error.
func refusal(res []string, b runbox.ClientBounds) error {
	switch {
	case len(res) >= 4 && res[0] == "full" && res[1] == "runs":
		return runbox.Limited(runbox.EBusy, queuedRetry,
			"this client has %s runs waiting, and may have %s; retry when some have started", res[2], res[3])
	case len(res) >= 4 && res[0] == "full":
		return runbox.Limited(runbox.EBusy, queuedRetry,
			"this client's waiting runs hold %s bytes, and may hold %s; retry when some have started", res[2], res[3])
	case len(res) >= 3 && res[0] == "seconds":
		used, _ := strconv.Atoi(res[1])
		asked, _ := strconv.Atoi(res[2])
		return secondsRefusal(used, asked, b.RunSecondsPerDay)
	}
	return fmt.Errorf("unexpected reply %v", res)
}

// queuedRetry is what a client whose queue is full is told to wait: runs
// start within seconds while slots free.
const queuedRetry = 2 * time.Second

// secondsRefusal refuses a run (or batch) asking for asked seconds of a
// day of which used are spent or reserved, of perDay.
func secondsRefusal(used, asked, perDay int) error {
	left := max(perDay-used, 0)
	return runbox.Limited(runbox.EQuotaExceeded, secondsRetry(used, perDay, time.Now()),
		"the runs would take up to %d seconds, and this client has %d of its %d left today (UTC), its runs' time limits reserved until they end; ask for a shorter timeout_seconds",
		asked, left, perDay)
}

// secondsRetry is when a client past its day's seconds may retry: at
// midnight (UTC) when it has used them all, else once runs holding
// reservations have ended.
func secondsRetry(used, perDay int, now time.Time) time.Duration {
	if used < perDay {
		return queuedRetry
	}
	now = now.UTC()
	return time.Date(now.Year(), now.Month(), now.Day()+1, 0, 0, 0, 0, time.UTC).Sub(now)
}

// dayKey is the suffix of a client's run seconds' counter for now's day.
func dayKey(now time.Time) string { return now.UTC().Format("20060102") }

// reconcileScript mends what a crash left of one client's counts: runs in
// its dispatched set that are queued no more (or gone) and, when ARGV[5]
// is "1", in its queue too, and reservations of runs that ended. Then it
// lets its ready heads go that it may dispatch, and returns them.
//
// KEYS[1] the client's queued hash, KEYS[2] its dispatched set,
// KEYS[3] its reservations
// ARGV[1] key prefix, ARGV[2] client, ARGV[3] now (unix ms), ARGV[4] ttl
// (s), ARGV[5] "1" to look at every run of the client's queue
var reconcileScript = redis.NewScript(admissionLua + `
local p, c = ARGV[1], ARGV[2]
local function status(id) return redis.call('HGET', p .. 'run:{' .. id .. '}', 'status') end
for _, id in ipairs(redis.call('ZRANGE', KEYS[2], 0, -1)) do
  if status(id) ~= 'queued' then forget(p, c, id) end
end
if ARGV[5] == '1' then
  for _, id in ipairs(redis.call('HKEYS', KEYS[1])) do
    if status(id) ~= 'queued' then forget(p, c, id) end
  end
  for _, id in ipairs(redis.call('HKEYS', KEYS[3])) do
    local s = status(id)
    if s ~= 'queued' and s ~= 'running' then unreserve(p, c, id) end
  end
end
if redis.call('HLEN', KEYS[1]) == 0 then redis.call('SREM', p .. 'clients:queued', c) end
local out = {}
release(p, c, tonumber(ARGV[3]), ARGV[4], out)
return out
`)

// Reconcile mends the clients' counts a crash may have left wrong (see
// reconcileScript; full looks at every run waiting, not only those
// dispatched) and returns the runs it let go: they head their
// conversations and are to be enqueued. The sweep calls it.
func (s *Runs) Reconcile(ctx context.Context, full bool) ([]string, error) {
	clients, err := s.rdb.SUnion(ctx, queuedClientsKey, readyClientsKey).Result()
	if err != nil {
		return nil, fmt.Errorf("reconcile clients' queues: %w", err)
	}
	var out []string
	for _, c := range clients {
		ids, err := reconcileScript.Run(ctx, s.rdb, []string{queuedKey(c), dispatchedKey(c), reservedKey(c)},
			prefix, c, s.now().UnixMilli(), s.ttlSeconds(), boolField(full)).StringSlice()
		if err != nil && !errors.Is(err, redis.Nil) {
			return out, fmt.Errorf("reconcile the queue of %s: %w", c, err)
		}
		out = append(out, ids...)
	}
	return out, nil
}

func dispatchedKey(client string) string { return prefix + "client:" + client + ":dispatched" }

// replyIDs are the run ids at the end of a script's reply.
func replyIDs(vs []any) []string {
	var ids []string
	for _, v := range vs {
		if id, ok := v.(string); ok && id != "" {
			ids = append(ids, id)
		}
	}
	return ids
}

// Queued returns how many runs client has waiting to start and the bytes
// they hold, as the bounds count them.
func (s *Runs) Queued(ctx context.Context, client string) (runs int, bytes int64, err error) {
	pipe := s.rdb.Pipeline()
	n := pipe.HLen(ctx, queuedKey(client))
	b := pipe.Get(ctx, queuedKey(client)+":total")
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return 0, 0, fmt.Errorf("read the queue of %s: %w", client, err)
	}
	bytes, _ = b.Int64()
	return int(n.Val()), bytes, nil
}
