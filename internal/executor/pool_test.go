package executor

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"sync"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/runbox-dev/runbox"
	"github.com/runbox-dev/runbox/internal/sandbox/engine"
)

// fakePool is the sandboxes as the pool filler sees them: Prestart fails
// with fail for the languages in failing, and succeeds for the others.
type fakePool struct {
	mu      sync.Mutex
	targets map[string]int
	pooled  map[string]int
	failing map[string]bool
	fail    error
	starts  map[string]int // Prestart calls, by language
	held    map[string]bool
	asked   int // StartsHeld calls
	wants   chan struct{}
}

func (f *fakePool) Pooled(lang string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.pooled[lang]
}

func (f *fakePool) PoolTarget(lang string, _ int) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.targets[lang]
}

func (f *fakePool) Prestart(_ context.Context, lang, _ string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.starts[lang]++
	if f.failing[lang] {
		return f.fail
	}
	f.pooled[lang]++
	return nil
}

func (f *fakePool) PoolWants() <-chan struct{} { return f.wants }

// Reclaim: nothing comes by recycling here.
func (f *fakePool) Reclaim(string, int) int { return 0 }

func (f *fakePool) StartsHeld(lang string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.asked++
	return f.held[lang]
}

// waitAsked waits until StartsHeld has been called more than n times: the
// filler has looked at its starts since.
func (f *fakePool) waitAsked(t *testing.T, n int) {
	t.Helper()
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(time.Millisecond) {
		f.mu.Lock()
		asked := f.asked
		f.mu.Unlock()
		if asked > n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("the pool filler did not look at its starts")
		}
	}
}

func (f *fakePool) set(change func()) {
	f.mu.Lock()
	change()
	f.mu.Unlock()
}

func (f *fakePool) started() map[string]int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return maps.Clone(f.starts)
}

type fakeSlots struct{}

func (fakeSlots) NewSlot(name string) (string, error) { return "/slots/" + name, nil }
func (fakeSlots) RemoveSlot(string) error             { return nil }
func (fakeSlots) RemoveSlots(string) error            { return nil }

// runFiller runs p's loop until stop (or the test's end), which waits for
// the loop and every start it made.
func runFiller(t *testing.T, p *poolFiller) (ctx context.Context, stop func()) {
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan struct{})
	go func() {
		defer close(done)
		p.loop(ctx)
	}()
	stop = func() {
		cancel()
		<-done
	}
	t.Cleanup(stop)
	return ctx, stop
}

// logFeed is a log's output, a line at a time.
type logFeed chan string

func (l logFeed) Write(p []byte) (int, error) {
	select {
	case l <- string(p):
	default: // never holds the filler up
	}
	return len(p), nil
}

// TestPoolStopsWithoutRoom: a pool start the engine has no room for
// stops every language's starts until the next retry — the pool makes no
// room, and another language's sandbox would not fit either — where
// another failure stops only its own language's.
func TestPoolStopsWithoutRoom(t *testing.T) {
	for _, tt := range []struct {
		name string
		fail error
		// retry: the retry comes, and python's start no longer fails.
		retry bool
		want  map[string]int
	}{
		{name: "no room: no language starts", fail: fmt.Errorf("start: %w", engine.ErrNoRoom),
			want: map[string]int{"python": 1}},
		{name: "no room, then the retry", fail: fmt.Errorf("start: %w", engine.ErrNoRoom), retry: true,
			want: map[string]int{"python": 2, "bash": 1}},
		{name: "another failure: the others start", fail: errors.New("image missing"),
			want: map[string]int{"python": 1, "bash": 1}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			clock := clockwork.NewFakeClock()
			f := &fakePool{targets: map[string]int{"python": 1}, pooled: map[string]int{},
				failing: map[string]bool{"python": true}, fail: tt.fail, starts: map[string]int{}, wants: make(chan struct{}),
				held: map[string]bool{}}
			lines := make(logFeed, 16)
			p := &poolFiller{sandboxes: f, slots: fakeSlots{}, executor: "ex",
				runners: []runbox.Runner{{Language: "python"}, {Language: "bash"}},
				wants:   f.wants, clock: clock, log: slog.New(slog.NewTextHandler(lines, nil))}
			ctx, stop := runFiller(t, p)

			// python's start failed, and the filler has taken it in: it
			// logs that as it does.
			select {
			case <-lines:
			case <-time.After(time.Minute):
				t.Fatal("the failed start was not logged")
			}
			// bash wants a sandbox now; each wake-up is taken once the
			// one before has been handled, and the start waits for
			// startDelay.
			f.set(func() { f.targets["bash"] = 1 })
			f.wants <- struct{}{}
			f.wants <- struct{}{}
			if err := clock.BlockUntilContext(ctx, 2); err != nil { // the retry's ticker, the delay
				t.Fatal(err)
			}
			clock.Advance(startDelay)
			if tt.retry {
				f.set(func() { f.failing["python"] = false })
				clock.Advance(poolRetry - startDelay)
				for deadline := time.Now().Add(time.Minute); !maps.Equal(f.started(), tt.want); time.Sleep(time.Millisecond) {
					if time.Now().After(deadline) {
						t.Fatalf("after the retry: %v started, want %v", f.started(), tt.want)
					}
				}
			}
			stop() // and every start it made has ended
			if got := f.started(); !maps.Equal(got, tt.want) {
				t.Errorf("started %v, want %v", got, tt.want)
			}
		})
	}
}

// TestPoolStartDelay: the start a new conversation's take calls for waits
// startDelay, and is not made while the manager holds starts (new
// conversations find the pool empty and recycling serves them).
func TestPoolStartDelay(t *testing.T) {
	for _, tt := range []struct {
		name string
		held bool
		want int
	}{
		{name: "not held: it starts once the delay is over", want: 1},
		{name: "held: none starts", held: true, want: 0},
	} {
		t.Run(tt.name, func(t *testing.T) {
			clock := clockwork.NewFakeClock()
			f := &fakePool{targets: map[string]int{"python": 1}, pooled: map[string]int{"python": 1},
				starts: map[string]int{}, held: map[string]bool{"python": tt.held}, wants: make(chan struct{})}
			p := &poolFiller{sandboxes: f, slots: fakeSlots{}, executor: "ex", runners: []runbox.Runner{{Language: "python"}},
				wants: f.wants, clock: clock, log: slog.New(slog.DiscardHandler)}
			ctx, _ := runFiller(t, p)
			f.waitAsked(t, 0) // the pool is full: nothing to start

			// A new conversation takes the pooled sandbox.
			f.set(func() { f.pooled["python"] = 0 })
			f.wants <- struct{}{}
			if err := clock.BlockUntilContext(ctx, 2); err != nil { // the retry's ticker, the delay
				t.Fatal(err)
			}
			if got := f.started()["python"]; got != 0 {
				t.Fatalf("%d started within the delay", got)
			}
			f.mu.Lock()
			asked := f.asked
			f.mu.Unlock()
			clock.Advance(startDelay)
			f.waitAsked(t, asked)
			for deadline := time.Now().Add(time.Minute); f.started()["python"] != tt.want; time.Sleep(time.Millisecond) {
				if time.Now().After(deadline) {
					t.Fatalf("%d started after the delay, want %d", f.started()["python"], tt.want)
				}
			}
		})
	}
}
