// Package store keeps the state that api and executors share in Redis: run
// records, each run's event log (with pub/sub for live listeners), the
// leases that prove a running run's executor is alive, and the registry of
// executors and the runners they offer.
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
)

// Key names. A run's keys share a hash tag so that its scripts touch one
// slot.
const prefix = "runbox:"

func runKey(id string) string           { return prefix + "run:{" + id + "}" }
func eventsKey(id string) string        { return prefix + "run:{" + id + "}:events" }
func channel(id string) string          { return prefix + "events:" + id }
func conversationKey(cid string) string { return prefix + "conv:" + cid + ":runs" }
func executorKey(id string) string      { return prefix + "executor:" + id }

const (
	leasesKey    = prefix + "leases"
	executorsKey = prefix + "executors"
)

// DefaultRetention is how long a run's record and events are kept.
const DefaultRetention = 24 * time.Hour

// ErrNotFound reports a run that does not exist (or has expired).
var ErrNotFound = runbox.Errorf(runbox.ENotFound, "no such run")

// Store reads and writes the shared state.
type Store struct {
	rdb       redis.UniversalClient
	retention time.Duration
	now       func() time.Time
}

// New returns a Store on rdb.
func New(rdb redis.UniversalClient) *Store {
	return &Store{rdb: rdb, retention: DefaultRetention, now: time.Now}
}

// Redis returns the client the store uses.
func (s *Store) Redis() redis.UniversalClient { return s.rdb }

func (s *Store) ttlSeconds() int64 { return int64(s.retention / time.Second) }

// CreateRun records a queued run and logs its queued event. It fails if
// the run exists.
func (s *Store) CreateRun(ctx context.Context, run runbox.Run) error {
	ev, err := eventBody(runbox.Event{TS: run.CreatedAt, Type: runbox.EventQueued})
	if err != nil {
		return err
	}
	created := run.CreatedAt.UnixMilli()
	args := []any{run.ID, created, channel(run.ID), s.ttlSeconds(), ev,
		"id", run.ID, "conversation", run.ConversationID, "language", run.Language,
		"created", created, "interactive", boolField(run.Interactive)}
	n, err := createScript.Run(ctx, s.rdb,
		[]string{runKey(run.ID), eventsKey(run.ID), conversationKey(run.ConversationID)}, args...).Int()
	if err != nil {
		return fmt.Errorf("create run: %w", err)
	}
	if n == 0 {
		return fmt.Errorf("create run %s: already exists", run.ID)
	}
	return nil
}

// Transition describes a change of a run's state.
type Transition struct {
	From   []runbox.Status // the run must be in one of these; none = any
	To     runbox.Status   // "" = unchanged
	Lease  LeaseOp
	Fields map[string]string
	Events []runbox.Event
}

// LeaseOp says what a transition does to the run's lease.
type LeaseOp int

const (
	LeaseKeep LeaseOp = iota
	LeaseSet
	LeaseDelete
	LeaseExpired // only if the lease has run out; then delete it
)

// Apply carries out t atomically. It reports false, with the run's current
// status, when the run was not in a status of t.From (or, for
// LeaseExpired, its lease was still current): then nothing changed.
func (s *Store) Apply(ctx context.Context, id string, t Transition, lease time.Duration) (bool, runbox.Status, error) {
	from := make([]string, len(t.From))
	for i, st := range t.From {
		from[i] = string(st)
	}
	op := [...]string{LeaseKeep: "", LeaseSet: "set", LeaseDelete: "del", LeaseExpired: "expired"}[t.Lease]
	args := []any{id, strings.Join(from, " "), string(t.To), op, lease.Milliseconds(),
		channel(id), s.ttlSeconds(), len(t.Fields)}
	for k, v := range t.Fields {
		args = append(args, k, v)
	}
	for _, ev := range t.Events {
		b, err := eventBody(ev)
		if err != nil {
			return false, "", err
		}
		args = append(args, b)
	}
	res, err := transitionScript.Run(ctx, s.rdb, []string{runKey(id), eventsKey(id), leasesKey}, args...).Slice()
	if err != nil {
		return false, "", fmt.Errorf("update run %s: %w", id, err)
	}
	if len(res) != 2 {
		return false, "", fmt.Errorf("update run %s: unexpected reply %v", id, res)
	}
	if ok, _ := res[0].(int64); ok == 1 {
		return true, "", nil
	}
	st, _ := res[1].(string)
	if st == "" {
		return false, "", ErrNotFound
	}
	return false, runbox.Status(st), nil
}

// Claim marks a queued run as running on executor, with a lease, and logs
// its started event. It reports false when the run is not queued: it was
// cancelled, or it already ran and must not run again.
func (s *Store) Claim(ctx context.Context, id, executor string, lease time.Duration) (bool, error) {
	now := s.now()
	ok, _, err := s.Apply(ctx, id, Transition{
		From:   []runbox.Status{runbox.StatusQueued},
		To:     runbox.StatusRunning,
		Lease:  LeaseSet,
		Fields: map[string]string{"executor": executor, "started": strconv.FormatInt(now.UnixMilli(), 10)},
		Events: []runbox.Event{{TS: now, Type: runbox.EventStarted}},
	}, lease)
	if errors.Is(err, ErrNotFound) {
		return false, nil
	}
	return ok, err
}

// Append logs events of a running run.
func (s *Store) Append(ctx context.Context, id string, evs ...runbox.Event) error {
	ok, st, err := s.Apply(ctx, id, Transition{From: []runbox.Status{runbox.StatusRunning}, Events: evs}, 0)
	if err != nil {
		return err
	}
	if !ok {
		return fmt.Errorf("append to run %s: run is %s", id, st)
	}
	return nil
}

// Finish ends a run in status with its result, logging evs and then the
// done event. It reports false when the run was not in a status of from
// (another party ended it first).
func (s *Store) Finish(ctx context.Context, id string, from []runbox.Status, lease LeaseOp, status runbox.Status, res *runbox.Result, evs ...runbox.Event) (bool, error) {
	b, err := json.Marshal(res)
	if err != nil {
		return false, err
	}
	now := s.now()
	evs = append(evs, runbox.Event{TS: now, Type: runbox.EventDone, Result: res})
	ok, _, err := s.Apply(ctx, id, Transition{
		From:   from,
		To:     status,
		Lease:  lease,
		Fields: map[string]string{"result": string(b), "finished": strconv.FormatInt(now.UnixMilli(), 10)},
		Events: evs,
	}, 0)
	return ok, err
}

// Run returns a run's record.
func (s *Store) Run(ctx context.Context, id string) (runbox.Run, error) {
	m, err := s.rdb.HGetAll(ctx, runKey(id)).Result()
	if err != nil {
		return runbox.Run{}, fmt.Errorf("read run %s: %w", id, err)
	}
	if len(m) == 0 || m["status"] == "" {
		return runbox.Run{}, ErrNotFound
	}
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
		run.Result = new(runbox.Result)
		if err := json.Unmarshal([]byte(r), run.Result); err != nil {
			return runbox.Run{}, fmt.Errorf("read run %s: result: %w", id, err)
		}
	}
	return run, nil
}

// Executor returns the id of the executor a run was claimed by.
func (s *Store) Executor(ctx context.Context, id string) (string, error) {
	v, err := s.rdb.HGet(ctx, runKey(id), "executor").Result()
	if errors.Is(err, redis.Nil) {
		return "", nil
	}
	return v, err
}

// Events returns a run's events with seq greater than after, in order.
func (s *Store) Events(ctx context.Context, id string, after int64) ([]runbox.Event, error) {
	raw, err := s.rdb.LRange(ctx, eventsKey(id), after, -1).Result()
	if err != nil {
		return nil, fmt.Errorf("read events of %s: %w", id, err)
	}
	evs := make([]runbox.Event, 0, len(raw))
	for _, r := range raw {
		var ev runbox.Event
		if err := json.Unmarshal([]byte(r), &ev); err != nil {
			return nil, fmt.Errorf("read events of %s: %w", id, err)
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

// ExecutorInfo is what an executor announces about itself.
type ExecutorInfo struct {
	ID          string          `json:"id"`
	Concurrency int             `json:"concurrency"`
	Runners     []runbox.Runner `json:"runners"`
	StartedAt   time.Time       `json:"started_at"`
}

// Heartbeat registers an executor as alive for ttl.
func (s *Store) Heartbeat(ctx context.Context, info ExecutorInfo, ttl time.Duration) error {
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

// Unregister removes an executor from the registry.
func (s *Store) Unregister(ctx context.Context, id string) error {
	pipe := s.rdb.TxPipeline()
	pipe.ZRem(ctx, executorsKey, id)
	pipe.Del(ctx, executorKey(id))
	_, err := pipe.Exec(ctx)
	return err
}

// Executors returns the executors whose heartbeat is current.
func (s *Store) Executors(ctx context.Context) ([]ExecutorInfo, error) {
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
	infos := make([]ExecutorInfo, 0, len(vals))
	for _, v := range vals {
		str, ok := v.(string)
		if !ok {
			continue
		}
		var info ExecutorInfo
		if json.Unmarshal([]byte(str), &info) == nil {
			infos = append(infos, info)
		}
	}
	return infos, nil
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
