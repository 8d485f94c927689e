// Package store keeps the state that api and executors share in Redis: run
// records, each run's event log (with pub/sub for live listeners), the
// leases that prove a running run's executor is alive, and the registry of
// executors and the runners they offer.
package store

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/go-redis/redis_rate/v10"
	"github.com/redis/go-redis/v9"

	"github.com/runbox-dev/runbox"
	"github.com/runbox-dev/runbox/internal/store/internal/keys"
)

// DefaultRetention is how long a run's record and events are kept.
const DefaultRetention = 24 * time.Hour

// Store reads and writes the shared state.
type Store struct {
	conn      *Conn
	rdb       redis.UniversalClient
	rate      *redis_rate.Limiter
	retention time.Duration
	now       func() time.Time
}

// New returns a Store on c.
func New(c *Conn) *Store {
	return &Store{conn: c, rdb: c.rdb, rate: redis_rate.NewLimiter(c.rdb), retention: DefaultRetention, now: time.Now}
}

// SetClock has the store take the time from now (an injected clock)
// where it records when something happened. Call it before use.
func (s *Store) SetClock(now func() time.Time) { s.now = now }

// Retention is how long runs and their traces are kept.
func (s *Store) Retention() time.Duration { return s.retention }

func (s *Store) ttlSeconds() int64 { return int64(s.retention / time.Second) }

// conversation. With Exists, the returned id is the earlier run's.
func (s *Store) CreateRun(ctx context.Context, nr runbox.NewRun) (runbox.Admission, string, error) {
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
		"id", run.ID, "conversation", cid, "language", run.Language,
		"created", created, "interactive", boolField(run.Interactive), specField, string(spec), "client", client}
	if cb := nr.Callback; cb.URL != "" {
		args = append(args, "callback", cb.URL)
		if cb.Started {
			args = append(args, "notify_started", "1")
		}
	}
	res, err := createScript.Run(ctx, s.rdb, []string{
		keys.Run(run.ID), keys.Events(run.ID), conversationRunsKey(cid), conversationHeadKey(cid),
		conversationPendingKey(cid), busyConvsKey, clientRunsKey(client), idemKey,
		parallelKey,
	}, args...).StringSlice()
	if err != nil {
		return 0, "", fmt.Errorf("create run: %w", err)
	}
	switch res[0] {
	case "enqueue", "wait":
		if err := s.runStarted(ctx, cid, run.ID); err != nil {
			return 0, "", fmt.Errorf("create run: %w", err)
		}
		if res[0] == "wait" {
			return runbox.AdmitWait, run.ID, nil
		}
		return runbox.AdmitEnqueue, run.ID, nil
	case "exists":
		return runbox.AdmitExists, res[1], nil
	case "busy":
		return 0, "", runbox.ErrBusy
	}
	return 0, "", fmt.Errorf("create run: unexpected reply %v", res)
}

// Spec returns what a run was asked to do.
func (s *Store) Spec(ctx context.Context, id string) (runbox.Spec, error) {
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
}

// Apply carries out t atomically.
func (s *Store) Apply(ctx context.Context, id string, t Transition, lease time.Duration) (runbox.Applied, error) {
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
	args := []any{id, strings.Join(from, " "), string(t.To), op, lease.Milliseconds(),
		keys.Channel(id), s.ttlSeconds(), t.Conversation, ends, final, prefix, len(t.Fields)}
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
		a := runbox.Applied{Done: true}
		if len(res) == 3 {
			a.Next, _ = res[2].(string)
		}
		return a, nil
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
func (s *Store) Claim(ctx context.Context, id, executor string, lease time.Duration) (bool, error) {
	c, err := s.ClaimFor(ctx, id, executor, lease, 0)
	return c.OK, err
}

// ClaimFor claims a queued run as Claim does, and keeps a conversation's
// live runs on one executor: while another live executor runs some of the
// run's conversation's, the run is not claimed and Elsewhere names that
// executor. A claim records executor as the conversation's owner for
// ownerTTL (none if 0), so that the conversation's next runs are routed to
// it. One round trip: the run's Spec comes back with the claim.
func (s *Store) ClaimFor(ctx context.Context, id, executor string, lease, ownerTTL time.Duration) (runbox.Claimed, error) {
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
// that now heads the conversation, to be enqueued ("" if none).
func (s *Store) Detach(ctx context.Context, id, cid string) (string, error) {
	a, err := s.Apply(ctx, id, Transition{
		From:         []runbox.Status{runbox.StatusRunning},
		Fields:       map[string]string{"detached": "1"},
		Events:       []runbox.Event{{TS: s.now(), Type: runbox.EventDetached}},
		Conversation: cid,
		Detach:       true,
	}, 0)
	if err != nil {
		return "", err
	}
	if !a.Done {
		return "", fmt.Errorf("detach run %s: run is %s", id, a.Status)
	}
	return a.Next, nil
}

// StaleParallel returns parallel runs created before cutoff that no
// executor has claimed yet, up to n: their enqueueing may have been lost.
func (s *Store) StaleParallel(ctx context.Context, cutoff time.Time, n int) ([]string, error) {
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
func (s *Store) ForgetParallel(ctx context.Context, ids ...string) error {
	if len(ids) == 0 {
		return nil
	}
	if err := s.rdb.ZRem(ctx, parallelKey, ids).Err(); err != nil {
		return fmt.Errorf("forget parallel runs: %w", err)
	}
	return nil
}

// Append logs events of a running run.
func (s *Store) Append(ctx context.Context, id string, evs ...runbox.Event) error {
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
func (s *Store) Finish(ctx context.Context, id string, e runbox.Ending) (runbox.Applied, error) {
	b, err := encodeResult(e.Result)
	if err != nil {
		return runbox.Applied{}, err
	}
	now := s.now()
	evs := append(slices.Clip(e.Events), runbox.Event{TS: now, Type: runbox.EventDone})
	a, err := s.Apply(ctx, id, Transition{
		From:         e.From,
		To:           e.Status,
		Lease:        e.Lease,
		Fields:       map[string]string{"result": string(b), "finished": strconv.FormatInt(now.UnixMilli(), 10)},
		Events:       evs,
		Conversation: e.Conversation,
	}, 0)
	if err == nil && a.Done && e.Conversation != "" {
		took := time.Duration(0)
		if e.Result != nil {
			took = time.Duration(e.Result.DurationMS) * time.Millisecond
		}
		// Should this fail, the run has still ended: it leaves its
		// client's active runs at its horizon, and the sweep lets in
		// what waits in its gate.
		_ = s.runEnded(ctx, e.Conversation, id, took)
	}
	return a, err
}

// Run returns a run's record.
func (s *Store) Run(ctx context.Context, id string) (runbox.Run, error) {
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

// withResult puts a run's result into its done event, which is stored
// without it.
func (s *Store) withResult(ctx context.Context, id string, ev *runbox.Event) error {
	if ev.Type != runbox.EventDone || ev.Result != nil {
		return nil
	}
	b, err := s.rdb.HGet(ctx, keys.Run(id), "result").Bytes()
	if errors.Is(err, redis.Nil) {
		return nil // the run's record expired with its log
	}
	if err != nil {
		return fmt.Errorf("read result of %s: %w", id, err)
	}
	ev.Result, err = decodeResult(b)
	if err != nil {
		return fmt.Errorf("read result of %s: %w", id, err)
	}
	return nil
}

// Executor returns the id of the executor a run was claimed by.
func (s *Store) Executor(ctx context.Context, id string) (string, error) {
	v, err := s.rdb.HGet(ctx, keys.Run(id), "executor").Result()
	if errors.Is(err, redis.Nil) {
		return "", nil
	}
	return v, err
}

// Events returns a run's events with seq greater than after, in order.
func (s *Store) Events(ctx context.Context, id string, after int64) ([]runbox.Event, error) {
	raw, err := s.rdb.LRange(ctx, keys.Events(id), after, -1).Result()
	if err != nil {
		return nil, fmt.Errorf("read events of %s: %w", id, err)
	}
	evs := make([]runbox.Event, 0, len(raw))
	for _, r := range raw {
		var ev runbox.Event
		if err := json.Unmarshal([]byte(r), &ev); err != nil {
			return nil, fmt.Errorf("read events of %s: %w", id, err)
		}
		if err := s.withResult(ctx, id, &ev); err != nil {
			return nil, err
		}
		evs = append(evs, ev)
	}
	return evs, nil
}

// RenewLeases extends the leases of running runs and returns the ids whose
// lease is gone: someone declared those runs dead, so their executor must
// stop them.
func (s *Store) RenewLeases(ctx context.Context, lease time.Duration, ids ...string) ([]string, error) {
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
func (s *Store) ExpiredLeases(ctx context.Context, n int) ([]string, error) {
	ids, err := expiredScript.Run(ctx, s.rdb, []string{leasesKey}, n).StringSlice()
	if err != nil {
		return nil, fmt.Errorf("read expired leases: %w", err)
	}
	return ids, nil
}

// Heartbeat registers an executor as alive for ttl.
func (s *Store) Heartbeat(ctx context.Context, info runbox.ExecutorInfo, ttl time.Duration) error {
	b, err := json.Marshal(info)
	if err != nil {
		return err
	}
	err = heartbeatScript.Run(ctx, s.rdb, []string{executorsKey, executorKey(info.ID)},
		info.ID, string(b), ttl.Milliseconds()).Err()
	if err != nil {
		return fmt.Errorf("heartbeat: %w", err)
	}
	return nil
}

// Deployment returns the id of the deployment this Redis serves, making
// one on first use. Executors label their containers with it, so that one
// may remove a dead peer's sandboxes without touching those of another
// deployment that shares the Docker Engine.
func (s *Store) Deployment(ctx context.Context) (string, error) {
	if err := s.rdb.SetNX(ctx, deploymentKey, rand.Text(), 0).Err(); err != nil {
		return "", fmt.Errorf("make deployment id: %w", err)
	}
	id, err := s.rdb.Get(ctx, deploymentKey).Result()
	if err != nil {
		return "", fmt.Errorf("read deployment id: %w", err)
	}
	return id, nil
}

// Unregister removes an executor from the registry.
func (s *Store) Unregister(ctx context.Context, id string) error {
	pipe := s.rdb.TxPipeline()
	pipe.ZRem(ctx, executorsKey, id)
	pipe.Del(ctx, executorKey(id), drainingKey(id))
	_, err := pipe.Exec(ctx)
	return err
}

// Executors returns the executors whose heartbeat is current.
func (s *Store) Executors(ctx context.Context) ([]runbox.ExecutorInfo, error) {
	ids, err := liveExecutorsScript.Run(ctx, s.rdb, []string{executorsKey}).StringSlice()
	if err != nil {
		return nil, fmt.Errorf("read executors: %w", err)
	}
	if len(ids) == 0 {
		return nil, nil
	}
	keys := make([]string, len(ids))
	for i, id := range ids {
		keys[i] = executorKey(id)
	}
	vals, err := s.rdb.MGet(ctx, keys...).Result()
	if err != nil {
		return nil, fmt.Errorf("read executors: %w", err)
	}
	infos := make([]runbox.ExecutorInfo, 0, len(vals))
	for _, v := range vals {
		str, ok := v.(string)
		if !ok {
			continue
		}
		var info runbox.ExecutorInfo
		if json.Unmarshal([]byte(str), &info) == nil {
			infos = append(infos, info)
		}
	}
	return infos, nil
}

// Landlock reports whether a live executor's sandboxes hold programs to
// filesystem rules.
func (s *Store) Landlock(ctx context.Context) (bool, error) {
	infos, err := s.Executors(ctx)
	if err != nil {
		return false, err
	}
	return slices.ContainsFunc(infos, func(i runbox.ExecutorInfo) bool { return i.Landlock }), nil
}

// Conversations returns how many conversations hold a sandbox on a live
// executor, as their heartbeats last said.
func (s *Store) Conversations(ctx context.Context) (int, error) {
	infos, err := s.Executors(ctx)
	n := 0
	for _, i := range infos {
		n += i.Conversations
	}
	return n, err
}

// Runners returns the languages offered by live executors, one entry per
// language, sorted by language.
func (s *Store) Runners(ctx context.Context) ([]runbox.Runner, error) {
	infos, err := s.Executors(ctx)
	if err != nil {
		return nil, err
	}
	seen := map[string]runbox.Runner{}
	for _, info := range infos {
		for _, r := range info.Runners {
			if _, ok := seen[r.Language]; !ok {
				seen[r.Language] = r
			}
		}
	}
	out := make([]runbox.Runner, 0, len(seen))
	for _, r := range seen {
		out = append(out, r)
	}
	slices.SortFunc(out, func(a, b runbox.Runner) int { return cmp.Compare(a.Language, b.Language) })
	return out, nil
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
