package sandbox

import (
	"testing"
	"time"
)

// The pool's policy, as tables of events on a fake clock. The last four
// races the pool met were between its decisions; each table below holds
// one of them: a press by one new conversation alone (the press window),
// a lone arrival reclaiming while a start was on its way for it (and its
// later looks pressing again), a recycled sandbox counted pooled and
// coming at once (joinPool), and a conversation's own sandbox reclaimed
// (adopted and not yet taken, or reclaimed in turns).

var t0 = time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)

// at is t0 plus d.
func at(d time.Duration) time.Time { return t0.Add(d) }

// TestPolicyPressWindow: the pool is pressed when a second new conversation
// finds it empty within pressWindow of the first — never by one alone,
// never when recycling is off — and stops being pressed pressWindow after
// the earlier of the last two.
func TestPolicyPressWindow(t *testing.T) {
	for _, tc := range []struct {
		name     string
		recycle  bool
		arrivals []time.Duration // when new conversations found the pool empty
		now      time.Duration
		want     bool
	}{
		{"none", true, nil, 0, false},
		{"one alone", true, []time.Duration{0}, time.Second, false},
		{"two within the window", true, []time.Duration{0, 3 * time.Second}, 4 * time.Second, true},
		{"two, the window past the first", true, []time.Duration{0, 3 * time.Second}, pressWindow, false},
		{"two further apart than the window", true, []time.Duration{0, pressWindow + time.Second}, pressWindow + 2*time.Second, false},
		{"a third renews it", true, []time.Duration{0, 9 * time.Second, 12 * time.Second}, 15 * time.Second, true},
		{"recycling off", false, []time.Duration{0, time.Second}, 2 * time.Second, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := newPoolPolicy[string](tc.recycle)
			for _, a := range tc.arrivals {
				p.look("python", at(a), true)
			}
			if got := p.pressed("python", at(tc.now)); got != tc.want {
				t.Errorf("pressed = %v; want %v", got, tc.want)
			}
			if got := p.pressed("bash", at(tc.now)); got {
				t.Error("another language is pressed")
			}
		})
	}
}

// TestPolicyLoneArrival: a new conversation alone that finds the pool empty
// while a start is on its way waits for that start — it reclaims nothing,
// and the filler reclaims nothing for it and keeps starting; its later
// looks (after a change that served another) do not press; a second
// arrival presses, and then reclaims. With nothing on its way, one alone
// reclaims for itself.
func TestPolicyLoneArrival(t *testing.T) {
	type step struct {
		do      string // "start", "arrive", "look", "wait", "waited"
		at      time.Duration
		reclaim bool // look's or arrive's answer
		counted bool // wait's answer
	}
	for _, tc := range []struct {
		name  string
		steps []step
		// after the steps: the filler's refill of 1, and whether its
		// starts are held
		coming, reclaims int
		held             bool
	}{
		{"alone, a start on its way", []step{
			{do: "start"},
			{do: "arrive", at: 0, reclaim: false},
			{do: "wait", counted: true},
		}, 0, 0, false},
		{"alone, its later looks", []step{
			{do: "start"},
			{do: "arrive", at: 0, reclaim: false},
			{do: "wait", counted: true},
			{do: "waited"},
			{do: "look", at: time.Second, reclaim: false},
			{do: "wait", counted: true},
			{do: "waited"},
			{do: "look", at: 2 * time.Second, reclaim: false},
		}, 0, 0, false},
		{"alone, nothing on its way", []step{
			{do: "arrive", at: 0, reclaim: true},
			{do: "wait", counted: false},
		}, 0, 0, false},
		{"a second arrival", []step{
			{do: "start"},
			{do: "arrive", at: 0, reclaim: false},
			{do: "wait", counted: true},
			{do: "arrive", at: time.Second, reclaim: true},
			{do: "wait", counted: false},
		}, 0, 1, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := newPoolPolicy[string](true)
			now := t0
			for i, s := range tc.steps {
				now = at(s.at)
				switch s.do {
				case "start":
					p.startBegan("python")
				case "arrive", "look":
					if got := p.look("python", now, s.do == "arrive"); got != s.reclaim {
						t.Fatalf("step %d (%s): reclaim = %v; want %v", i, s.do, got, s.reclaim)
					}
				case "wait":
					if got := p.wait("python"); got != s.counted {
						t.Fatalf("step %d: counted = %v; want %v", i, got, s.counted)
					}
				case "waited":
					p.waited("python")
				}
			}
			if coming, reclaims := p.refill("python", 1, now); coming != tc.coming || reclaims != tc.reclaims {
				t.Errorf("refill = %d coming, %d to reclaim; want %d, %d", coming, reclaims, tc.coming, tc.reclaims)
			}
			if held := p.startsHeld("python", now); held != tc.held {
				t.Errorf("startsHeld = %v; want %v", held, tc.held)
			}
		})
	}
}

// TestPolicyStarvedEndsTheHold: a new conversation that waited in vain ends the
// hold on the pool's starts for pressWindow.
func TestPolicyStarvedEndsTheHold(t *testing.T) {
	p := newPoolPolicy[string](true)
	p.look("python", at(0), true)
	p.look("python", at(time.Second), true)
	if !p.startsHeld("python", at(2*time.Second)) {
		t.Fatal("a pressed pool's starts are not held")
	}
	p.gaveUp("python", at(2*time.Second))
	if p.startsHeld("python", at(3*time.Second)) {
		t.Error("starts held after a conversation waited in vain")
	}
}

// TestPolicyPooledOrComing: a recycled sandbox is on its way or pooled, never
// both — what the pool filler counts (pooled, and coming from refill)
// stays one across its joining the pool, whenever it is read.
func TestPolicyPooledOrComing(t *testing.T) {
	p := newPoolPolicy[string](true)
	count := func() int {
		coming, _ := p.refill("python", 10, t0)
		return p.pooled("python") + coming
	}
	steps := []struct {
		name string
		do   func()
		want int
	}{
		{"recycle begins", func() { p.recycleBegan("python") }, 1},
		{"it joins the pool", func() { p.push("python", "sb1", true) }, 1},
		{"a new conversation takes it", func() { p.pop("python") }, 0},
		{"another recycle begins", func() { p.recycleBegan("python") }, 1},
		{"it is removed instead", func() { p.recycleDropped("python") }, 0},
		{"a start joins", func() { p.push("python", "sb2", false) }, 1},
	}
	for _, s := range steps {
		s.do()
		if got := count(); got != s.want {
			t.Fatalf("after %s: pooled and coming = %d; want %d", s.name, got, s.want)
		}
		if w := p.onWay("python"); w < 0 {
			t.Fatalf("after %s: %d on the way", s.name, w)
		}
	}
}

// TestPolicyReclaimWhose: a reclaim takes the longest-idle warm sandbox it may,
// never a conversation's own about to be used — adopted from the pool and
// not yet taken by its run, with a kept interpreter, held by a run under
// way, or sharing its folder with another sandbox — nor one of a
// conversation whose sandbox was reclaimed within reclaimSpare.
func TestPolicyReclaimWhose(t *testing.T) {
	old, older := t0.Add(-time.Minute), t0.Add(-2*time.Minute)
	for _, tc := range []struct {
		name       string
		recycle    bool
		spared     []string // reclaimed that long before now
		sparedAt   time.Duration
		candidates []reclaimable
		want       int
	}{
		{"the longest idle", true, nil, 0, []reclaimable{{conversation: "a", since: old}, {conversation: "b", since: older}}, 1},
		{"adopted, not yet taken", true, nil, 0, []reclaimable{{conversation: "a", since: old}, {conversation: "new", since: older, adopted: true}}, 0},
		{"kept state", true, nil, 0, []reclaimable{{conversation: "k", since: older, kept: true}}, -1},
		{"a run under way", true, nil, 0, []reclaimable{{conversation: "r", since: older, held: true}}, -1},
		{"a folder shared", true, nil, 0, []reclaimable{{conversation: "s", since: older, shared: true}}, -1},
		{"reclaimed a moment ago", true, []string{"b"}, -time.Second, []reclaimable{{conversation: "a", since: old}, {conversation: "b", since: older}}, 0},
		{"reclaimed long ago", true, []string{"b"}, -reclaimSpare, []reclaimable{{conversation: "a", since: old}, {conversation: "b", since: older}}, 1},
		{"recycling off", false, nil, 0, []reclaimable{{conversation: "a", since: old}}, -1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p := newPoolPolicy[string](tc.recycle)
			for _, c := range tc.spared {
				p.reclaim([]reclaimable{{conversation: c}}, at(tc.sparedAt))
			}
			if got := p.reclaim(tc.candidates, t0); got != tc.want {
				t.Fatalf("reclaim = %d; want %d", got, tc.want)
			}
			if tc.want >= 0 {
				// Its conversation is spared from now on.
				again := []reclaimable{{conversation: tc.candidates[tc.want].conversation, since: older}}
				if got := p.reclaim(again, at(time.Second)); got != -1 {
					t.Errorf("the same conversation reclaimed again a second later")
				}
			}
		})
	}
}
