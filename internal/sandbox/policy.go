package sandbox

import (
	"time"
)

// poolPolicy is the pool of new conversations' sandboxes as its policy
// sees it, apart from the sandboxes' lifecycle and the host: per language,
// the sandboxes pooled (of any type T: the manager's *sandbox, a name in
// tests), those on their way (starting, recycling), the new conversations
// waiting for them, when new conversations found the pool empty, when one
// waited in vain, and which conversations a reclaim spares. Each decision
// of the pool is a method, given the time it acts at; none does I/O or
// reads a clock, so its races are tested as tables of events
// (policy_test.go). The manager holds it under its mutex, carries out
// what it decides on the sandboxes, and tells it what became of them.
//
// What the counts stand for (reclaim.go says why): a sandbox is pooled,
// or on its way, never both (push leaves recycling as it pools); a new
// conversation that finds the pool empty presses it only on arrival, and
// the pool is pressed when a second did within pressWindow of the first;
// one alone with a sandbox on its way waits for it rather than reclaim.
type poolPolicy[T any] struct {
	// recycle says whether idle sandboxes may be recycled into the pool
	// (Options.Recycle): without it the pool is never pressed.
	recycle bool
	pool    map[string][]T // oldest first
	// starting, recycling: on their way; waiting: the new conversations
	// each promised one of them.
	starting, recycling, waiting map[string]int
	// arrivals are when the last two new conversations found their
	// language's pool empty, the earlier first.
	arrivals map[string][2]time.Time
	// starved is when a new conversation last waited in vain and started
	// a sandbox of its own; spared, when each conversation's sandbox was
	// last reclaimed.
	starved, spared map[string]time.Time
}

func newPoolPolicy[T any](recycle bool) *poolPolicy[T] {
	return &poolPolicy[T]{recycle: recycle, pool: map[string][]T{},
		starting: map[string]int{}, recycling: map[string]int{}, waiting: map[string]int{},
		arrivals: map[string][2]time.Time{}, starved: map[string]time.Time{}, spared: map[string]time.Time{}}
}

// pooled returns how many sandboxes of lang wait in the pool.
func (p *poolPolicy[T]) pooled(lang string) int { return len(p.pool[lang]) }

// push pools sb; recycled says it was counted as recycling, which it
// leaves in the same step.
func (p *poolPolicy[T]) push(lang string, sb T, recycled bool) {
	if recycled {
		p.recycling[lang]--
	}
	p.pool[lang] = append(p.pool[lang], sb)
}

// pop takes the sandbox of lang that waited longest (one recycled a moment
// ago may still be starting its interpreter).
func (p *poolPolicy[T]) pop(lang string) (sb T, ok bool) {
	q := p.pool[lang]
	if len(q) == 0 {
		return sb, false
	}
	p.pool[lang] = q[1:]
	return q[0], true
}

// popForRoom takes a sandbox to remove to make room: the newest of the
// largest pool (those that waited longest go first to new conversations).
func (p *poolPolicy[T]) popForRoom() (sb T, ok bool) {
	largest := ""
	for l, q := range p.pool {
		if n := len(q); n > 0 && (largest == "" || n > len(p.pool[largest]) || n == len(p.pool[largest]) && l < largest) {
			largest = l
		}
	}
	if largest == "" {
		return sb, false
	}
	q := p.pool[largest]
	p.pool[largest] = q[:len(q)-1]
	return q[len(q)-1], true
}

// drain takes every pooled sandbox.
func (p *poolPolicy[T]) drain() []T {
	var all []T
	for lang, q := range p.pool {
		all = append(all, q...)
		delete(p.pool, lang)
	}
	return all
}

// startBegan and startEnded count a start for the pool.
func (p *poolPolicy[T]) startBegan(lang string) { p.starting[lang]++ }
func (p *poolPolicy[T]) startEnded(lang string) { p.starting[lang]-- }

// recycleBegan counts a sandbox recycling into the pool; recycleDropped,
// one that was not pooled after all (removed; push ends the others').
func (p *poolPolicy[T]) recycleBegan(lang string)   { p.recycling[lang]++ }
func (p *poolPolicy[T]) recycleDropped(lang string) { p.recycling[lang]-- }

// pressed reports whether two new conversations found lang's pool empty
// on arrival within pressWindow (reclaim.go): idle sandboxes are then
// reclaimed for the pool, and it starts none (startsHeld).
func (p *poolPolicy[T]) pressed(lang string, now time.Time) bool {
	earlier := p.arrivals[lang][0]
	return p.recycle && !earlier.IsZero() && now.Sub(earlier) < pressWindow
}

// onWay is how many sandboxes of lang are on their way and not promised to
// a conversation waiting already.
func (p *poolPolicy[T]) onWay(lang string) int {
	return p.starting[lang] + p.recycling[lang] - p.waiting[lang]
}

// look is a new conversation's look at lang's empty pool (arrived: its
// first): it reports whether the conversation reclaims an idle sandbox
// for itself — a reset is quicker than a start — which it does unless a
// recycle under way is not promised yet, or a start is on its way and the
// pool is not pressed (the start is the refill meant for it).
func (p *poolPolicy[T]) look(lang string, now time.Time, arrived bool) (reclaim bool) {
	if arrived {
		p.arrivals[lang] = [2]time.Time{p.arrivals[lang][1], now}
	}
	return p.recycling[lang] <= p.waiting[lang] && (p.onWay(lang) <= 0 || p.pressed(lang, now))
}

// wait counts a new conversation among those waiting for a sandbox of
// lang on its way, if one is not promised; it reports whether it did
// (waited uncounts it). Without one, the conversation waits for whatever
// comes, uncounted.
func (p *poolPolicy[T]) wait(lang string) bool {
	if p.onWay(lang) <= 0 {
		return false
	}
	p.waiting[lang]++
	return true
}

func (p *poolPolicy[T]) waited(lang string) { p.waiting[lang]-- }

// gaveUp records that a new conversation of lang waited in vain and
// starts a sandbox of its own.
func (p *poolPolicy[T]) gaveUp(lang string, now time.Time) { p.starved[lang] = now }

// startsHeld reports whether the pool filler should start no sandbox of
// lang: the pool is pressed and recycling served every new conversation
// (none waited in vain within pressWindow).
func (p *poolPolicy[T]) startsHeld(lang string, now time.Time) bool {
	starved, ok := p.starved[lang]
	return p.pressed(lang, now) && (!ok || now.Sub(starved) >= pressWindow)
}

// refill is the pool filler's ask for n more of lang: coming is how many
// recycles under way count for it, reclaim how many idle sandboxes to
// reclaim for the rest (none unless the pool is pressed).
func (p *poolPolicy[T]) refill(lang string, n int, now time.Time) (coming, reclaim int) {
	coming = min(p.recycling[lang], max(n, 0))
	if p.pressed(lang, now) {
		reclaim = max(n-coming, 0)
	}
	return coming, reclaim
}

// reclaimable is what the policy knows of an idle warm sandbox a reclaim may
// take.
type reclaimable struct {
	conversation string
	since        time.Time
	// adopted: a new conversation adopted it and its run has not taken it
	// yet; kept: a kept-state cell ran in it (saving its state takes
	// seconds); held: its conversation has a run under way here; shared:
	// its conversation has another sandbox here. Each keeps it from a
	// reclaim: the folder it mounts is in use, or about to be.
	adopted, kept, held, shared bool
}

// reclaim picks the longest-idle of candidates a reclaim may take: none
// of a conversation spared (its sandbox reclaimed within reclaimSpare, so
// that conversations that run one after another do not take each other's
// sandboxes in turn), and none that its flags keep. It returns its
// index, -1 for none, and spares its conversation from now on.
func (p *poolPolicy[T]) reclaim(candidates []reclaimable, now time.Time) int {
	if !p.recycle {
		return -1
	}
	for conv, at := range p.spared {
		if now.Sub(at) >= reclaimSpare {
			delete(p.spared, conv)
		}
	}
	best := -1
	for i, c := range candidates {
		if _, spared := p.spared[c.conversation]; spared || c.adopted || c.kept || c.held || c.shared {
			continue
		}
		if best < 0 || c.since.Before(candidates[best].since) {
			best = i
		}
	}
	if best >= 0 {
		p.spared[candidates[best].conversation] = now
	}
	return best
}
