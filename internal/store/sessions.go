package store

import (
	"context"
	"crypto/rand"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/runbox-dev/runbox"
	"github.com/runbox-dev/runbox/internal/store/internal/keys"
)

// Sessions keeps MCP sessions: when each was last used, the ones ending,
// and their executions (commands) and the places those hold.
type Sessions struct{ *base }

// MCP sessions and the executions started in them (the commands tools).
// A session is named by its client and its id: another client's session
// of the same id is another session. Every api replica shares them, so a
// session's calls may reach any replica.
//
// The session record lives until the session ends (End); the idle index
// says when each session was last used, for the janitor that ends those
// idle past their TTL. An execution is a run: its record names its
// session, and each session keeps its executions by start time and the
// set of those still live (queued or running), which bounds how many may
// run at once.

func sessionMember(client, id string) string { return client + "\n" + id }

func sessionKey(client, id string) string {
	return prefix + "mcpsession:{" + sessionMember(client, id) + "}"
}
func sessionExecsKey(client, id string) string { return sessionKey(client, id) + ":execs" }
func sessionLiveKey(client, id string) string  { return sessionKey(client, id) + ":live" }
func executionKey(runID string) string         { return prefix + "execution:" + runID }

const (
	sessionsIdleKey = prefix + "mcpsessions:idle" // sessions by when last used
	// sessionsEndingKey holds the sessions ended whose holders have not
	// all let go yet (their runs, their folder), by when that was last
	// tried: a process that stops halfway leaves them for the janitor.
	sessionsEndingKey = prefix + "mcpsessions:ending"
	executionsLive    = prefix + "mcpsessions:live-runs" // every session's live executions
	// pendingPrefix marks a place taken in the live sets for an execution
	// whose run is being made (ReserveExecution).
	pendingPrefix = "pending:"
	// pendingTTL is how long a place is held for a run that never came
	// (its api died between reserving and recording it).
	pendingTTL = time.Minute
	// maxSessionExecutions bounds what a session remembers of its
	// executions.
	maxSessionExecutions = 500
)

// OpenSession records a new session, used now.
func (s *Sessions) OpenSession(ctx context.Context, ref runbox.SessionRef, ttl time.Duration) error {
	now := s.now()
	pipe := s.rdb.TxPipeline()
	pipe.HSet(ctx, sessionKey(ref.Client, ref.ID), "created", now.UnixMilli())
	pipe.Expire(ctx, sessionKey(ref.Client, ref.ID), safetyTTL(ttl))
	pipe.ZAdd(ctx, sessionsIdleKey, redis.Z{Score: float64(now.UnixMilli()), Member: sessionMember(ref.Client, ref.ID)})
	if _, err := pipe.Exec(ctx); err != nil {
		return fmt.Errorf("open session: %w", err)
	}
	return nil
}

// safetyTTL is how long a session's record outlives its last use should
// nothing end it: the janitor ends it once idle past ttl.
func safetyTTL(ttl time.Duration) time.Duration { return 2*ttl + time.Hour }

// TouchSession marks a session used now and reports whether it exists.
func (s *Sessions) TouchSession(ctx context.Context, ref runbox.SessionRef, ttl time.Duration) (bool, error) {
	pipe := s.rdb.Pipeline()
	exists := pipe.Expire(ctx, sessionKey(ref.Client, ref.ID), safetyTTL(ttl))
	pipe.ZAddXX(ctx, sessionsIdleKey, redis.Z{Score: float64(s.now().UnixMilli()), Member: sessionMember(ref.Client, ref.ID)})
	if _, err := pipe.Exec(ctx); err != nil {
		return false, fmt.Errorf("touch session: %w", err)
	}
	return exists.Val(), nil
}

// EndSession forgets a session and its executions' places; it reports
// whether the session existed. Its runs are the caller's to cancel.
func (s *Sessions) EndSession(ctx context.Context, ref runbox.SessionRef) (bool, error) {
	return s.endSession(ctx, ref, math.MaxInt64)
}

// EndIdleSession is EndSession for a session last used before cutoff
// (IdleSessions): one used since is left open, and reported not ended.
func (s *Sessions) EndIdleSession(ctx context.Context, ref runbox.SessionRef, cutoff time.Time) (bool, error) {
	return s.endSession(ctx, ref, cutoff.UnixMilli())
}

func (s *Sessions) endSession(ctx context.Context, ref runbox.SessionRef, cutoff int64) (bool, error) {
	n, err := endSessionScript.Run(ctx, s.rdb,
		[]string{sessionKey(ref.Client, ref.ID), sessionsIdleKey, sessionExecsKey(ref.Client, ref.ID), sessionLiveKey(ref.Client, ref.ID), sessionsEndingKey},
		sessionMember(ref.Client, ref.ID), cutoff, s.now().UnixMilli()).Int()
	if err != nil {
		return false, fmt.Errorf("end session: %w", err)
	}
	return n > 0, nil
}

// endSessionScript forgets a session unless it was used after a cutoff,
// and records it as ending until its holders have let go (SessionEnded).
//
// KEYS[1] the session, KEYS[2] sessions by last use, KEYS[3] its
// executions, KEYS[4] its live executions, KEYS[5] sessions ending
// ARGV[1] its member in KEYS[2], ARGV[2] the cutoff (Unix ms), ARGV[3] now
// Returns 1 if it ended the session, 0 if there was none, -1 if it was
// used since.
var endSessionScript = redis.NewScript(`
local used = redis.call('ZSCORE', KEYS[2], ARGV[1])
if used and tonumber(used) > tonumber(ARGV[2]) then return -1 end
local n = redis.call('DEL', KEYS[1])
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('DEL', KEYS[3], KEYS[4])
if n > 0 then redis.call('ZADD', KEYS[5], ARGV[3], ARGV[1]) end
return n
`)

// SessionOpen reports whether a session is open.
func (s *Sessions) SessionOpen(ctx context.Context, ref runbox.SessionRef) (bool, error) {
	n, err := s.rdb.Exists(ctx, sessionKey(ref.Client, ref.ID)).Result()
	if err != nil {
		return false, fmt.Errorf("read session: %w", err)
	}
	return n > 0, nil
}

// SessionEnded records that what held something of an ended session has
// let go.
func (s *Sessions) SessionEnded(ctx context.Context, ref runbox.SessionRef) error {
	if err := s.rdb.ZRem(ctx, sessionsEndingKey, sessionMember(ref.Client, ref.ID)).Err(); err != nil {
		return fmt.Errorf("record a session's end: %w", err)
	}
	return nil
}

// EndingSessions returns up to n sessions ended whose holders had not all
// let go when last tried, before cutoff, and marks them tried now.
func (s *Sessions) EndingSessions(ctx context.Context, cutoff time.Time, n int) ([]runbox.SessionRef, error) {
	members, err := s.sessionsBefore(ctx, sessionsEndingKey, cutoff, n)
	if err != nil {
		return nil, fmt.Errorf("list ending sessions: %w", err)
	}
	out := make([]runbox.SessionRef, 0, len(members))
	now := float64(s.now().UnixMilli())
	for _, m := range members {
		if err := s.rdb.ZAddXX(ctx, sessionsEndingKey, redis.Z{Score: now, Member: m}).Err(); err != nil {
			return nil, fmt.Errorf("list ending sessions: %w", err)
		}
		out = append(out, sessionRef(m))
	}
	return out, nil
}

// IdleSessions returns up to n sessions last used before cutoff.
func (s *Sessions) IdleSessions(ctx context.Context, cutoff time.Time, n int) ([]runbox.SessionRef, error) {
	members, err := s.sessionsBefore(ctx, sessionsIdleKey, cutoff, n)
	if err != nil {
		return nil, fmt.Errorf("list idle sessions: %w", err)
	}
	out := make([]runbox.SessionRef, 0, len(members))
	for _, m := range members {
		out = append(out, sessionRef(m))
	}
	return out, nil
}

// sessionsBefore returns up to n sessions of the index key (a sorted set
// of sessionMember by Unix ms) scored before cutoff.
func (s *Sessions) sessionsBefore(ctx context.Context, key string, cutoff time.Time, n int) ([]string, error) {
	return s.rdb.ZRangeByScore(ctx, key, &redis.ZRangeBy{
		Min: "-inf", Max: strconv.FormatInt(cutoff.UnixMilli(), 10), Count: int64(n),
	}).Result()
}

// sessionRef is the session a sessionMember names.
func sessionRef(member string) runbox.SessionRef {
	client, id, _ := strings.Cut(member, "\n")
	return runbox.SessionRef{Client: client, ID: id}
}

// reserveScript takes a place for a new execution of a session, within
// the session's and the deployment's limits, after forgetting the places
// of executions that have ended (their run is final, or gone) and of
// reservations never filled.
//
// KEYS[1] the session's live set, KEYS[2] the deployment's
// ARGV[1] now (unix ms), ARGV[2] per-session limit, ARGV[3] total limit
// (0: none), ARGV[4] the reservation, ARGV[5] pending cutoff (unix ms),
// ARGV[6] run key prefix, ARGV[7] run key suffix
// Returns {"ok"}, {"session"} or {"total"}.
var reserveScript = redis.NewScript(`
local final = {succeeded=true, failed=true, timed_out=true, cancelled=true, error=true}
local function prune(key)
  local members = redis.call('ZRANGE', key, 0, -1, 'WITHSCORES')
  for i = 1, #members, 2 do
    local m, score = members[i], tonumber(members[i+1])
    if string.sub(m, 1, 8) == 'pending:' then
      if score < tonumber(ARGV[5]) then redis.call('ZREM', key, m) end
    else
      local st = redis.call('HGET', ARGV[6] .. m .. ARGV[7], 'status')
      if not st or final[st] then redis.call('ZREM', key, m) end
    end
  end
end
prune(KEYS[1])
if redis.call('ZCARD', KEYS[1]) >= tonumber(ARGV[2]) then return {'session'} end
if tonumber(ARGV[3]) > 0 then
  prune(KEYS[2])
  if redis.call('ZCARD', KEYS[2]) >= tonumber(ARGV[3]) then return {'total'} end
end
redis.call('ZADD', KEYS[1], ARGV[1], ARGV[4])
redis.call('ZADD', KEYS[2], ARGV[1], ARGV[4])
return {'ok'}
`)

// ReserveExecution takes a place among the session's live executions, or
// refuses with *ErrTooManyExecutions.
func (s *Sessions) ReserveExecution(ctx context.Context, ref runbox.SessionRef, limits runbox.ExecutionLimits) (runbox.Reservation, error) {
	now := s.now()
	member := pendingPrefix + rand.Text()
	prefix, suffix, _ := strings.Cut(keys.Run("\x00"), "\x00")
	res, err := reserveScript.Run(ctx, s.rdb, []string{sessionLiveKey(ref.Client, ref.ID), executionsLive},
		now.UnixMilli(), limits.PerSession, limits.Total, member, now.Add(-pendingTTL).UnixMilli(), prefix, suffix).StringSlice()
	if err != nil {
		return runbox.Reservation{}, fmt.Errorf("reserve an execution: %w", err)
	}
	switch res[0] {
	case "session":
		return runbox.Reservation{}, &runbox.ErrTooManyExecutions{Limit: limits.PerSession}
	case "total":
		return runbox.Reservation{}, &runbox.ErrTooManyExecutions{Total: true, Limit: limits.Total}
	}
	return runbox.Reservation{Session: ref, Member: member}, nil
}

// Release gives a reservation's place back (its run was not made).
func (s *Sessions) Release(ctx context.Context, r runbox.Reservation) error {
	pipe := s.rdb.TxPipeline()
	pipe.ZRem(ctx, sessionLiveKey(r.Session.Client, r.Session.ID), r.Member)
	pipe.ZRem(ctx, executionsLive, r.Member)
	if _, err := pipe.Exec(ctx); err != nil {
		return fmt.Errorf("release an execution's place: %w", err)
	}
	return nil
}

// RecordExecution fills a reservation with the run made for it.
func (s *Sessions) RecordExecution(ctx context.Context, r runbox.Reservation, e runbox.Execution) error {
	now := float64(s.now().UnixMilli())
	live, execs := sessionLiveKey(r.Session.Client, r.Session.ID), sessionExecsKey(r.Session.Client, r.Session.ID)
	pipe := s.rdb.TxPipeline()
	pipe.ZRem(ctx, live, r.Member)
	pipe.ZRem(ctx, executionsLive, r.Member)
	pipe.ZAdd(ctx, live, redis.Z{Score: now, Member: e.RunID})
	pipe.ZAdd(ctx, executionsLive, redis.Z{Score: now, Member: e.RunID})
	pipe.ZAdd(ctx, execs, redis.Z{Score: now, Member: e.RunID})
	pipe.ZRemRangeByRank(ctx, execs, 0, -maxSessionExecutions-1)
	pipe.Expire(ctx, execs, s.retention)
	pipe.Expire(ctx, live, s.retention)
	pipe.HSet(ctx, executionKey(e.RunID), "session", sessionMember(r.Session.Client, r.Session.ID), "command", e.Command,
		"timeout", e.TimeoutSeconds)
	pipe.Expire(ctx, executionKey(e.RunID), s.retention)
	if _, err := pipe.Exec(ctx); err != nil {
		return fmt.Errorf("record an execution: %w", err)
	}
	return nil
}

// SessionExecution returns what the session remembers of execution id,
// or runbox.ErrRunNotFound when it is not the session's.
func (s *Sessions) SessionExecution(ctx context.Context, ref runbox.SessionRef, id string) (runbox.Execution, error) {
	m, err := s.rdb.HGetAll(ctx, executionKey(id)).Result()
	if err != nil {
		return runbox.Execution{}, fmt.Errorf("read execution %s: %w", id, err)
	}
	if m["session"] != sessionMember(ref.Client, ref.ID) {
		return runbox.Execution{}, runbox.ErrRunNotFound
	}
	return execution(id, m), nil
}

// ExecutionOf returns what is remembered of execution id, whoever's it
// is: for a caller that found it through its session.
func (s *Sessions) ExecutionOf(ctx context.Context, id string) (runbox.Execution, error) {
	m, err := s.rdb.HGetAll(ctx, executionKey(id)).Result()
	if err != nil {
		return runbox.Execution{}, fmt.Errorf("read execution %s: %w", id, err)
	}
	if len(m) == 0 {
		return runbox.Execution{}, runbox.ErrRunNotFound
	}
	return execution(id, m), nil
}

func execution(id string, m map[string]string) runbox.Execution {
	timeout, _ := strconv.Atoi(m["timeout"])
	return runbox.Execution{RunID: id, Command: m["command"], TimeoutSeconds: timeout}
}

// SessionExecutions returns the session's last n executions, oldest
// first.
func (s *Sessions) SessionExecutions(ctx context.Context, ref runbox.SessionRef, n int) ([]runbox.Execution, error) {
	ids, err := s.rdb.ZRange(ctx, sessionExecsKey(ref.Client, ref.ID), int64(-n), -1).Result()
	if err != nil {
		return nil, fmt.Errorf("list executions: %w", err)
	}
	pipe := s.rdb.Pipeline()
	cmds := make([]*redis.MapStringStringCmd, len(ids))
	for i, id := range ids {
		cmds[i] = pipe.HGetAll(ctx, executionKey(id))
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return nil, fmt.Errorf("list executions: %w", err)
	}
	out := make([]runbox.Execution, 0, len(ids))
	for i, id := range ids {
		out = append(out, execution(id, cmds[i].Val()))
	}
	return out, nil
}
