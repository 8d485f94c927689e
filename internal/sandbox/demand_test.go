package sandbox

import (
	"context"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
)

// TestDemand: the pool follows the new conversations of the last window,
// less the sandboxes recycled into it, and holds at least what is taken
// while a sandbox starts, within the configured floor and the ceiling, and
// shrinks back after.
func TestDemand(t *testing.T) {
	clock := clockwork.NewFakeClock()
	d := newDemand(clock)
	steps := []struct {
		name        string
		takes, back int
		start       time.Duration // a start timed, if any
		advance     time.Duration
		configured  int
		byRecycling bool // refills are recycles of 100 ms, reclaimed
		want        int
	}{
		{"quiet: the configured count", 0, 0, 0, 0, 2, false, 2},
		{"a burst of 5", 5, 0, 0, time.Second, 2, false, 5},
		{"capped at the ceiling", 20, 0, 0, time.Second, 2, false, 8},
		{"still within the window", 0, 0, 0, 5 * time.Second, 2, false, 8},
		{"after the window", 0, 0, 0, demandWindow, 2, false, 2},
		{"each take recycled back, starts of 1 s: what 1 s takes (10 in 10 s)", 10, 10, 0, time.Second, 1, false, 1},
		{"after the window again", 0, 0, 0, demandWindow, 2, false, 2},
		{"30 taken, 30 back, starts of 2 s: 30 in 10 s is 6 in 2 s", 30, 30, 2 * time.Second, time.Second, 2, false, 6},
		{"takes outrun the recycling", 0, 0, 0, demandWindow, 2, false, 2},
		{"takes outrun the recycling", 6, 1, 0, time.Second, 2, false, 5},
		{"after the window once more", 0, 0, 0, demandWindow, 2, false, 2},
		{"40 taken, 40 back, starts of 2 s: 40 in 10 s is 8 in 2 s", 40, 40, 0, time.Second, 2, false, 8},
		{"the same refilled by recycles of 100 ms: 0.4, the configured 2", 0, 0, 0, 0, 2, true, 2},
		{"40 more half a second ago, by recycles of 100 ms: 40 in the last second is 4 in 0.1 s", 40, 40, 0, 500 * time.Millisecond, 2, true, 4},
		{"no pool configured: none", 3, 0, 0, 0, 0, false, 0},
	}
	for _, s := range steps {
		for range s.takes {
			d.took("python")
		}
		for range s.back {
			d.recycled("python", 100*time.Millisecond)
		}
		if s.start > 0 {
			// The moving average is the first start timed itself.
			d.started("python", s.start)
		}
		clock.Advance(s.advance)
		if got := d.target("python", s.configured, 8, s.byRecycling); got != s.want {
			t.Errorf("%s: target %d, want %d", s.name, got, s.want)
		}
	}
	if got := d.target("bash", 1, 8, false); got != 1 {
		t.Errorf("another language: %d", got)
	}
}

// TestStartedAverage: the lead follows the starts timed, the newest a
// quarter.
func TestStartedAverage(t *testing.T) {
	d := newDemand(clockwork.NewFakeClock())
	d.started("python", 400*time.Millisecond)
	d.started("python", 800*time.Millisecond)
	if got := d.lead["python"]; got != 500*time.Millisecond {
		t.Errorf("lead %v, want 500ms", got)
	}
}

func TestPoolCeiling(t *testing.T) {
	for _, c := range []struct {
		name               string
		maxPool, maxWarm   int
		budget, perSandbox int64
		want               int
	}{
		{"the pool's bound", 16, 32, 0, 512 << 20, 16},
		{"the warm bound is lower", 16, 4, 0, 0, 4},
		{"memory for 6 at 512 MiB", 16, 32, 3 << 30, 512 << 20, 6},
		{"memory for none", 16, 32, 100 << 20, 512 << 20, 0},
		{"no memory limit per sandbox", 16, 32, 1 << 30, 0, 16},
		{"no warm sandbox allowed", 16, 0, 0, 0, 0},
	} {
		if got := poolCeiling(c.maxPool, c.maxWarm, c.budget, c.perSandbox); got != c.want {
			t.Errorf("%s: %d, want %d", c.name, got, c.want)
		}
	}
}

// TestAdoptWaitsForAStart: a new conversation that finds the pool empty
// waits for a sandbox that is starting, one conversation per start, until
// one arrives or adoptWait passes; with none starting it waits adoptGrace
// for one to begin.
func TestAdoptWaitsForAStart(t *testing.T) {
	clock := clockwork.NewFakeClock()
	m := NewManager(nil, Options{Clock: clock, MaxWarm: WarmLimits{Default: 8}})
	adopt := func(slot string) (string, error) { return slot + "-adopted", nil }
	waiting := func(n int) {
		t.Helper()
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(time.Millisecond) {
			m.mu.Lock()
			w := m.policy.waiting["python"]
			m.mu.Unlock()
			if w == n {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%d waiting, want %d", w, n)
			}
		}
	}
	setStarting := func(n int) {
		m.mu.Lock()
		m.policy.starting["python"] = n
		m.poolChangedLocked()
		m.mu.Unlock()
	}

	// graced runs an Adopt that finds nothing on its way: it waits
	// adoptGrace for something to come, and gets nothing.
	graced := func(conv string, timers int) {
		t.Helper()
		got := make(chan bool)
		go func() { got <- m.Adopt(context.Background(), conv, "python", adopt) }()
		if err := clock.BlockUntilContext(t.Context(), timers); err != nil { // its grace's and the others'
			t.Fatal(err)
		}
		clock.Advance(adoptGrace)
		if <-got {
			t.Fatalf("%s adopted with nothing pooled or starting", conv)
		}
	}
	graced("none", 1)

	got := make(chan bool)
	// A start that begins within the grace is waited for.
	go func() { got <- m.Adopt(context.Background(), "c1", "python", adopt) }()
	if err := clock.BlockUntilContext(t.Context(), 1); err != nil {
		t.Fatal(err)
	}
	setStarting(1)
	waiting(1)
	// A second conversation does not wait for the start the first waits for.
	graced("c2", 2) // c1's deadline and its grace
	sb := &sandbox{m: m, id: "pooled", key: warmKey{language: "python"}, dataDir: "slot", done: make(chan struct{})}
	if err := m.toPool("python", sb); err != nil {
		t.Fatal(err)
	}
	setStarting(0)
	if !<-got {
		t.Fatal("the waiting conversation did not get the started sandbox")
	}
	m.mu.Lock()
	w := m.warm[warmKey{"c1", "python"}]
	m.mu.Unlock()
	if w != sb || sb.dataDir != "slot-adopted" {
		t.Fatalf("c1's warm sandbox %v in %q", w, sb.dataDir)
	}

	// A start that takes too long: the conversation starts its own.
	setStarting(1)
	go func() { got <- m.Adopt(context.Background(), "c3", "python", adopt) }()
	waiting(1)
	if err := clock.BlockUntilContext(t.Context(), 1); err != nil { // its deadline's timer
		t.Fatal(err)
	}
	clock.Advance(adoptWait)
	if <-got {
		t.Fatal("adopted with nothing started")
	}
	waiting(0)
}
