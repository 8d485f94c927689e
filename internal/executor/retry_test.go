package executor

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"net"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/runbox-dev/runbox"
	"github.com/runbox-dev/runbox/internal/store"
	"github.com/runbox-dev/runbox/internal/testenv"
)

func TestRetryWait(t *testing.T) {
	r := retry{first: 50 * time.Millisecond, most: time.Second}
	for n, want := range map[int]time.Duration{1: 50 * time.Millisecond, 2: 100 * time.Millisecond,
		5: 800 * time.Millisecond, 6: time.Second, 7: time.Second, 1000: time.Second} {
		if got := r.wait(n); got != want {
			t.Errorf("wait(%d) = %v, want %v", n, got, want)
		}
	}
}

// refused is what a write to a Redis that is down fails with.
var refused = &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}

// TestRetryDo: a write the store could not take is tried again, waiting
// longer each time, until it is taken, fails otherwise, or the caller
// gives up; the outage is logged once, not at every try.
func TestRetryDo(t *testing.T) {
	ms := time.Millisecond
	for _, tc := range []struct {
		name string
		// fails are the errors of the first tries; then the op succeeds.
		fails []error
		// stopAfter gives up (stop closes, or ctx is cancelled) once that
		// many tries failed; 0 never does.
		stopAfter int
		cancel    bool
		tries     int
		waits     []time.Duration
		err       error
		logs      []string
	}{
		{name: "answers", tries: 1, logs: nil},
		{name: "answers again", fails: []error{refused, refused, refused, refused}, tries: 5,
			waits: []time.Duration{50 * ms, 100 * ms, 200 * ms, 400 * ms},
			logs:  []string{"WARN write: the store cannot be reached", "INFO write: the store answers again"}},
		{name: "its own error", fails: []error{runbox.ErrRunNotFound}, tries: 1, err: runbox.ErrRunNotFound},
		{name: "its own error after an outage", fails: []error{refused, runbox.ErrRunNotFound}, tries: 2,
			waits: []time.Duration{50 * ms}, err: runbox.ErrRunNotFound,
			logs: []string{"WARN write: the store cannot be reached", "INFO write: the store answers again"}},
		{name: "stopped", fails: slices.Repeat([]error{refused}, 10), stopAfter: 3, tries: 3,
			waits: []time.Duration{50 * ms, 100 * ms, 200 * ms}, err: refused,
			logs: []string{"WARN write: the store cannot be reached"}},
		{name: "stopped before", fails: slices.Repeat([]error{refused}, 10), stopAfter: -1, tries: 1,
			waits: []time.Duration{50 * ms}, err: refused, logs: []string{"WARN write: the store cannot be reached"}},
		{name: "cancelled", fails: slices.Repeat([]error{refused}, 10), stopAfter: 2, cancel: true, tries: 2,
			waits: []time.Duration{50 * ms, 100 * ms}, err: refused,
			logs: []string{"WARN write: the store cannot be reached"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clock := newTimerClock()
			r := retry{clock: clock, first: 50 * ms, most: time.Second}
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			stop := make(chan struct{})
			gaveUp := false
			giveUp := func() {
				gaveUp = true
				if tc.cancel {
					cancel()
				} else {
					close(stop)
				}
			}
			if tc.stopAfter < 0 {
				giveUp()
			}
			var logs bytes.Buffer
			o := &outage{log: slog.New(slog.NewTextHandler(&logs, nil)), what: "write"}
			tries := 0
			done := make(chan error, 1)
			go func() {
				done <- r.do(ctx, stop, o, func(context.Context) error {
					tries++
					if tries <= len(tc.fails) {
						return tc.fails[tries-1]
					}
					return nil
				})
			}()
			err := clock.run(t, done, func(waiting int) bool {
				if waiting == tc.stopAfter {
					giveUp()
				}
				return !gaveUp
			})
			if !errors.Is(err, tc.err) || (err == nil) != (tc.err == nil) {
				t.Errorf("err %v, want %v", err, tc.err)
			}
			if tries != tc.tries || !slices.Equal(clock.waits(), tc.waits) {
				t.Errorf("%d tries, waits %v; want %d, %v", tries, clock.waits(), tc.tries, tc.waits)
			}
			if got := logLines(logs.String()); !slices.Equal(got, tc.logs) {
				t.Errorf("logged %q, want %q", got, tc.logs)
			}
		})
	}
}

// TestFinishWaitsForRedis: a run that ends while Redis is down has its
// real end recorded once Redis is back — the conversation's executor
// and the result, with its final events — and the outage is logged once.
func TestFinishWaitsForRedis(t *testing.T) {
	ctx := context.Background()
	mr, url := testenv.Miniredis(t)
	st := store.New(store.NewConn(testenv.Client(t, url)))
	spec := runbox.Spec{Language: "bash", Code: "echo hi", ConversationID: "c1"}
	if _, _, err := st.CreateRun(ctx, runbox.NewRun{Run: runbox.Run{ID: "r1", ConversationID: "c1", Language: "bash",
		CreatedAt: time.Now()}, Spec: spec, MaxWaiting: 3}); err != nil {
		t.Fatal(err)
	}
	if c, err := st.ClaimFor(ctx, "r1", "ex", time.Minute, 0); err != nil || !c.OK {
		t.Fatalf("claim: %+v, %v", c, err)
	}
	// Its heartbeat is current: it may own conversations (the claim
	// recorded it as the conversation's for no time).
	if err := st.Heartbeat(ctx, runbox.ExecutorInfo{ID: "ex"}, time.Hour); err != nil {
		t.Fatal(err)
	}
	clock := newTimerClock()
	var logs bytes.Buffer
	log := slog.New(slog.NewTextHandler(&logs, nil))
	e := &Executor{cfg: Config{ID: "ex", Clock: clock, OwnerTTL: time.Hour}, store: st, sched: nopScheduler{},
		retry: retry{clock: clock, first: retryFirst, most: retryMost}, halted: make(chan struct{}), log: log}
	res := runState{status: runbox.StatusSucceeded,
		result: runbox.Result{RunID: "r1", ConversationID: "c1", Success: true, Stdout: "hi\n", Output: "hi\n"},
		events: []runbox.Event{{TS: time.Now(), Type: runbox.EventStdout, Data: "hi\n"}}}
	// Claimed long ago: its end records the conversation's executor again.
	c := &claimed{spec: spec, at: clock.Now().Add(-time.Hour)}

	mr.Close()
	done := make(chan error, 1)
	go func() { done <- e.finish("r1", c, res, log) }()
	const outage = 3 // tries that fail
	if err := clock.run(t, done, func(waiting int) bool {
		if waiting == outage {
			if err := mr.Restart(); err != nil {
				t.Error(err)
			}
		}
		return true
	}); err != nil {
		t.Fatal(err)
	}

	if got := clock.waits(); len(got) != outage {
		t.Errorf("waited %v; want %d waits", got, outage)
	}
	run, err := st.Run(ctx, "r1")
	if err != nil || run.Status != runbox.StatusSucceeded || run.Result == nil || run.Result.Stdout != "hi\n" {
		t.Errorf("recorded %+v, %v", run, err)
	}
	evs, err := st.Events(ctx, "r1", 0)
	if err != nil || !slices.ContainsFunc(evs, func(ev runbox.Event) bool { return ev.Type == runbox.EventStdout && ev.Data == "hi\n" }) {
		t.Errorf("events %+v, %v", evs, err)
	}
	if owner, err := st.Owner(ctx, "c1"); err != nil || owner != "ex" {
		t.Errorf("conversation's executor %q, %v", owner, err)
	}
	want := []string{"WARN record result: the store cannot be reached", "INFO record result: the store answers again", "INFO run finished"}
	if got := logLines(logs.String()); !slices.Equal(got, want) {
		t.Errorf("logged %q, want %q", got, want)
	}
}

// TestFinishHalted: once a stopping executor stops waiting for its runs,
// a run's end is tried once.
func TestFinishHalted(t *testing.T) {
	mr, url := testenv.Miniredis(t)
	mr.Close()
	clock := newTimerClock()
	log := slog.New(slog.DiscardHandler)
	e := &Executor{cfg: Config{ID: "ex", Clock: clock, OwnerTTL: time.Hour},
		store: store.New(store.NewConn(testenv.Client(t, url))), sched: nopScheduler{},
		retry: retry{clock: clock, first: retryFirst, most: retryMost}, halted: make(chan struct{}), log: log}
	close(e.halted)
	err := e.finish("r1", &claimed{spec: runbox.Spec{ConversationID: "c1"}, at: clock.Now()},
		runState{status: runbox.StatusSucceeded}, log)
	if !store.Transient(err) || len(clock.waits()) != 1 {
		t.Errorf("err %v after %d tries; want the store's, after 1", err, len(clock.waits()))
	}
}

// timerClock is a fake clock that lists the timers asked of it.
type timerClock struct {
	*clockwork.FakeClock
	mu    sync.Mutex
	asked []time.Duration
}

func newTimerClock() *timerClock { return &timerClock{FakeClock: clockwork.NewFakeClock()} }

func (c *timerClock) NewTimer(d time.Duration) clockwork.Timer {
	c.mu.Lock()
	c.asked = append(c.asked, d)
	c.mu.Unlock()
	return c.FakeClock.NewTimer(d)
}

func (c *timerClock) waits() []time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	return slices.Clone(c.asked)
}

// run lets the timers of one goroutine fire as soon as it waits on them,
// until it sends its result on done. Each time it waits, before its timer
// fires, waiting is called with how many times it waited: if it returns
// false, the timer is left and the goroutine is waited for.
func (c *timerClock) run(t *testing.T, done <-chan error, waiting func(n int) (fire bool)) error {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for {
		blocked := make(chan error, 1)
		go func() { blocked <- c.BlockUntilContext(ctx, 1) }()
		select {
		case err := <-done:
			cancel()
			<-blocked
			return err
		case err := <-blocked:
			if err != nil {
				t.Fatal("the goroutine neither waited nor ended")
			}
			if !waiting(len(c.waits())) {
				return <-done
			}
			c.Advance(time.Hour)
		}
	}
}

// logLines are the level and the start of the message of each line
// logged.
func logLines(s string) []string {
	var out []string
	for l := range strings.Lines(s) {
		_, rest, _ := strings.Cut(l, " level=")
		level, msg, _ := strings.Cut(rest, " msg=")
		if m, ok := strings.CutPrefix(msg, `"`); ok {
			msg, _, _ = strings.Cut(m, `"`)
		} else {
			msg, _, _ = strings.Cut(msg, " ")
		}
		msg, _, _ = strings.Cut(msg, ";")
		out = append(out, level+" "+msg)
	}
	return out
}

// nopScheduler enqueues nothing.
type nopScheduler struct{}

func (nopScheduler) Enqueue(context.Context, ...string) error { return nil }
func (nopScheduler) Sweep(context.Context)                    {}
func (nopScheduler) EnqueueFor(context.Context, string, runbox.Spec, string) error {
	return nil
}
