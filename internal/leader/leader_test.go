package leader

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/runbox-dev/runbox/internal/store"
	"github.com/runbox-dev/runbox/internal/testenv"
)

// eventually waits for cond, which background goroutines make true.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("never: %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

func TestOneLeader(t *testing.T) {
	mr, url := testenv.Miniredis(t)
	st := store.New(store.NewConn(testenv.Client(t, url)))
	clock := clockwork.NewFakeClock()
	log := slog.New(slog.DiscardHandler)
	ctx := context.Background()
	a, b := NewElector(st, "a", clock, log), NewElector(st, "b", clock, log)
	if err := a.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if err := b.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if !a.Leading() || b.Leading() {
		t.Fatalf("a leads %v, b leads %v: want a alone", a.Leading(), b.Leading())
	}

	ran := make(chan string, 10)
	for name, e := range map[string]*Elector{"a": a, "b": b} {
		go e.Every(time.Second, func(context.Context) { ran <- name })(ctx)
	}
	clock.BlockUntilContext(ctx, 4) // two electors, two chores
	clock.Advance(time.Second)
	if got := <-ran; got != "a" {
		t.Errorf("the chore ran on %s", got)
	}

	// An orderly stop resigns: b takes over at its next try.
	a.Stop()
	clock.Advance(Interval)
	eventually(t, "b leads after a resigned", b.Leading)

	// A leader that dies (no resign) holds the lease until its TTL.
	b.Stop()
	if ok, err := st.Lead(ctx, "dead", TTL); err != nil || !ok {
		t.Fatalf("take the lease: %v %v", ok, err)
	}
	c := NewElector(st, "c", clock, log)
	c.Start(ctx)
	defer c.Stop()
	if c.Leading() {
		t.Fatal("c leads while a dead leader's lease lasts")
	}
	mr.FastForward(TTL)
	clock.BlockUntilContext(ctx, 3) // c and the two chores
	clock.Advance(Interval)
	eventually(t, "c leads after the dead leader's lease lapsed", c.Leading)
}
