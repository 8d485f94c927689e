package sandbox

import (
	"context"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
)

// TestReclaim: a new conversation that finds the pool empty gets the
// longest-idle warm sandbox that may be reclaimed, reset, instead of
// waiting for a start — never one with a kept interpreter, one of a
// conversation with a run under way or another sandbox here, nor, for
// reclaimSpare, one of a conversation reclaimed before. The pool filler's
// Reclaim takes them only while new conversations find the pool empty.
func TestReclaim(t *testing.T) {
	base := t.TempDir()
	var mu sync.Mutex
	dirs := map[string]string{} // by conversation
	// The conversation's folder, mounted by its sandbox, becomes a slot,
	// as files.Folders.Recycle makes it.
	recycle := func(conv string, _ func(string) bool, _ time.Time) (string, error) {
		mu.Lock()
		defer mu.Unlock()
		slot := filepath.Join(base, "slot-"+conv)
		err := os.Rename(dirs[conv], slot)
		delete(dirs, conv)
		return slot, err
	}
	m := newManagerWith(t, func(o *Options) {
		o.MaxPool = WarmLimits{Default: 4}
		o.Recycle = recycle
	})
	ctx := context.Background()
	dir := func(conv string) string {
		mu.Lock()
		defer mu.Unlock()
		if dirs[conv] == "" {
			dirs[conv] = dataDir(t)
		}
		return dirs[conv]
	}
	run := func(conv, lang string, keep bool) string {
		t.Helper()
		var c capture
		code := "print(open('/etc/hostname').read().strip())"
		if lang == "bash" {
			code = "cat /etc/hostname"
		}
		oc, err := m.Run(ctx, Request{RunID: "r-" + conv, ConversationID: conv, Language: lang, Code: code,
			KeepState: keep, Timeout: time.Minute, DataDir: dir(conv)}, c.output)
		if err != nil || oc.ExitCode != 0 {
			t.Fatalf("%s: %+v %v %s", conv, oc, err, c.stderr.String())
		}
		return c.stdout.String()
	}
	// adopt asks for a pooled sandbox for a new conversation, as the
	// executor does: the slot takes the conversation's folder's place.
	adopt := func(conv string) bool {
		t.Helper()
		d := filepath.Join(base, conv)
		ok := m.Adopt(ctx, conv, "python", func(slot string) (string, error) { return d, os.Rename(slot, d) })
		if ok {
			mu.Lock()
			dirs[conv] = d
			mu.Unlock()
		}
		return ok
	}

	if n := m.Reclaim("python", 4); n != 0 {
		t.Errorf("the filler reclaimed %d while no new conversation found the pool empty", n)
	}
	// Idle from the longest to the shortest: kept, held, two, a, b.
	run("kept", "python", true)
	run("held", "python", false)
	release := m.Hold("held")
	defer release()
	run("two", "python", false)
	run("two", "bash", false)
	hostA := run("a", "python", false)
	hostB := run("b", "python", false)
	if n := m.Reclaim("python", 4); n != 0 {
		t.Errorf("the filler reclaimed %d while no new conversation found the pool empty", n)
	}

	if !adopt("c") {
		t.Fatal("c got no sandbox")
	}
	if got := run("c", "python", false); got != hostA {
		t.Errorf("c runs in %q, want a's reclaimed %q", got, hostA)
	}
	// a comes back: it gets a sandbox of its own, and is spared.
	run("a", "python", false)
	if !adopt("d") {
		t.Fatal("d got no sandbox")
	}
	if got := run("d", "python", false); got != hostB {
		t.Errorf("d runs in %q, want b's reclaimed %q", got, hostB)
	}
	if !adopt("e") { // c's, then d's: neither came back
		t.Fatal("e got no sandbox")
	}
	if !adopt("f") {
		t.Fatal("f got no sandbox")
	}
	run("e", "python", false)
	run("f", "python", false)
	// Left: a (spared), kept, held, two — and e and f, idle the shortest,
	// which the filler reclaims now that new conversations found the pool
	// empty.
	if n := m.Reclaim("python", 4); n != 2 {
		t.Errorf("the filler reclaimed %d, want e's and f's", n)
	}
	deadline := time.Now().Add(30 * time.Second)
	for m.Pooled("python") < 2 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if m.Pooled("python") != 2 {
		t.Fatalf("%d pooled, want e's and f's", m.Pooled("python"))
	}
	if n := m.Reclaim("python", 4); n != 0 {
		t.Errorf("the filler reclaimed %d more: one that must not be", n)
	}
	for _, conv := range []string{"kept", "held", "two", "a"} {
		if !m.HasSandbox(conv) {
			t.Errorf("%s lost its sandbox", conv)
		}
	}
}

// TestStartsHeld: while new conversations find the pool empty and
// recycling serves them, the pool starts nothing; one alone does not hold
// it; a conversation that waited in vain (and starts a sandbox of its own)
// ends the hold, as does a pressWindow with no conversation finding the
// pool empty. A wait its caller gave up is not one in vain.
func TestStartsHeld(t *testing.T) {
	clock := clockwork.NewFakeClock()
	m := NewManager(nil, Options{Clock: clock, MaxWarm: WarmLimits{Default: 8},
		Recycle: func(string, func(string) bool, time.Time) (string, error) { return "", nil }})
	adopt := func(slot string) (string, error) { return slot + "-adopted", nil }
	held := func(want bool, when string) {
		t.Helper()
		if got := m.StartsHeld("python"); got != want {
			t.Fatalf("%s: starts held %v, want %v", when, got, want)
		}
	}
	got := make(chan bool)
	adoptIn := func(ctx context.Context, conv string) {
		go func() { got <- m.Adopt(ctx, conv, "python", adopt) }()
	}
	held(false, "before any new conversation")

	// One new conversation finds the pool empty: a refill may be under
	// way. Its caller gives up.
	ctx, cancel := context.WithCancel(t.Context())
	adoptIn(ctx, "alone")
	if err := clock.BlockUntilContext(t.Context(), 1); err != nil { // its grace
		t.Fatal(err)
	}
	held(false, "while one alone waits")
	cancel()
	if <-got {
		t.Fatal("a cancelled conversation adopted a sandbox")
	}

	// A second finds it empty too; a recycled sandbox comes.
	adoptIn(t.Context(), "served")
	if err := clock.BlockUntilContext(t.Context(), 1); err != nil {
		t.Fatal(err)
	}
	held(true, "while a second waits")
	sb := &sandbox{m: m, id: "recycled", key: warmKey{language: "python"}, dataDir: "slot", done: make(chan struct{})}
	if err := m.toPool("python", sb); err != nil {
		t.Fatal(err)
	}
	if !<-got {
		t.Fatal("the waiting conversation did not get the recycled sandbox")
	}
	held(true, "once recycling served it")

	ctx, cancel = context.WithCancel(t.Context())
	adoptIn(ctx, "cancelled")
	cancel()
	if <-got {
		t.Fatal("a cancelled conversation adopted a sandbox")
	}
	held(true, "after a wait its caller gave up")

	adoptIn(t.Context(), "starved")
	for waiting := true; waiting; {
		clock.Advance(adoptGrace)
		select {
		case ok := <-got:
			if ok {
				t.Fatal("adopted with nothing pooled or on its way")
			}
			waiting = false
		case <-time.After(10 * time.Millisecond):
		}
	}
	held(false, "after a conversation waited in vain")

	clock.Advance(pressWindow)
	held(false, "a quiet pressWindow later")
	ctx, cancel = context.WithCancel(t.Context())
	defer cancel()
	adoptIn(ctx, "pressed again")
	adoptIn(ctx, "and again")
	for deadline := time.Now().Add(10 * time.Second); !m.StartsHeld("python"); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("starts not held when the pool was found empty again, a pressWindow after the last waited in vain")
		}
	}
	cancel()
	<-got
	<-got
}

// TestLoneArrival: a new conversation that finds the pool empty while a
// start is on its way (the pool filling at an executor's start, or its
// refill after a take) waits for that start: it reclaims no idle
// conversation's sandbox, nor does the pool filler, which keeps starting.
// A second new conversation that finds the pool empty presses it.
func TestLoneArrival(t *testing.T) {
	clock := clockwork.NewFakeClock()
	m := NewManager(nil, Options{Clock: clock, MaxWarm: WarmLimits{Default: 8},
		Recycle: func(string, func(string) bool, time.Time) (string, error) { return "", nil }})
	idle := &sandbox{m: m, id: "idle", key: warmKey{conversation: "earlier", language: "python"}, dataDir: "earlier",
		done: make(chan struct{})}
	m.mu.Lock()
	m.warm[idle.key] = idle
	m.policy.starting["python"] = 1 // the pool's start under way
	m.mu.Unlock()
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	got := make(chan bool, 2)
	go func() { got <- m.Adopt(ctx, "lone", "python", func(slot string) (string, error) { return slot, nil }) }()
	if err := clock.BlockUntilContext(t.Context(), 1); err != nil { // its adoptWait for the start
		t.Fatal(err)
	}
	m.mu.Lock()
	waiting, recycling, kept := m.policy.waiting["python"], m.policy.recycling["python"], m.warm[idle.key] == idle
	m.mu.Unlock()
	if waiting != 1 || recycling != 0 || !kept {
		t.Errorf("waiting %d, recycling %d, idle sandbox kept %v: want the start waited for, nothing reclaimed", waiting, recycling, kept)
	}
	if n := m.Reclaim("python", 2); n != 0 {
		t.Errorf("the filler reclaimed %d for one new conversation", n)
	}
	if m.StartsHeld("python") || m.pressedNow("python") {
		t.Error("one new conversation pressed the pool")
	}

	// Its later looks do not press the pool again: here the start ends
	// and brings nothing, and it waits adoptGrace beside adoptWait.
	m.mu.Lock()
	delete(m.warm, idle.key) // not for this test to recycle
	m.policy.starting["python"] = 0
	m.poolChangedLocked()
	m.mu.Unlock()
	if err := clock.BlockUntilContext(t.Context(), 2); err != nil {
		t.Fatal(err)
	}
	if m.pressedNow("python") {
		t.Error("one new conversation's second look pressed the pool")
	}

	// A second new conversation arrives (its caller gives up at once).
	ctx2, cancel2 := context.WithCancel(t.Context())
	cancel2()
	go func() {
		got <- m.Adopt(ctx2, "second", "python", func(slot string) (string, error) { return slot, nil })
	}()
	if <-got {
		t.Fatal("a cancelled conversation adopted a sandbox")
	}
	if !m.pressedNow("python") {
		t.Error("two new conversations that found the pool empty did not press it")
	}
}
