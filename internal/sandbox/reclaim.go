package sandbox

import "time"

// A new conversation that finds its language's pool empty would wait for
// a container start: hundreds of milliseconds on a quiet host, seconds
// under a burst of new conversations, whose starts share the CPU with the
// runs. Idle sandboxes kept warm for their conversations (fewer than
// MaxWarm, so none was evicted) are a cheaper source: a reset takes tens
// of milliseconds. So while new conversations come faster than the pool
// fills, the longest-idle warm sandboxes are reclaimed — taken from their
// conversations and recycled into the pool, as an eviction for the warm
// limit would (recycle.go):
//
//   - a new conversation that finds the pool empty reclaims one for itself
//     and waits for it rather than for a start (nextPooled) — unless a
//     start is on its way and the pool is not pressed;
//   - while the pool is pressed — a second new conversation found it empty
//     within pressWindow of the first (pressedNow) — the pool filler
//     refills it by reclaiming (Reclaim) and starts no container unless a new
//     conversation waited in vain meanwhile (StartsHeld), and the pool is
//     sized for refills that take a reset's time, not a start's
//     (demand.go);
//   - a new conversation that finds nothing on its way waits adoptGrace
//     for a run to end and park a sandbox it may reclaim.
//
// A conversation whose sandbox comes back after a reclaim (its next run
// gets a pooled sandbox, its files moved in) is not reclaimed again for
// reclaimSpare: conversations that run one after another must not take
// each other's sandboxes in turn. Never reclaimed: a sandbox adopted by a
// new conversation whose run has not taken it yet, one where a
// kept-state cell ran (its interpreter's state would be saved, seconds),
// one of a conversation with a run under way or with another sandbox
// here (its folder is theirs too), and none when recycling is off
// (Options.Recycle nil).

// pressWindow is how long after a new conversation found its pool empty
// the pool is refilled by reclaiming.
const pressWindow = demandWindow

// reclaimSpare is how long a conversation whose sandbox was reclaimed is
// spared another reclaim.
const reclaimSpare = time.Minute

// Reclaim refills language's pool by up to n sandboxes from the warm ones
// while new conversations find the pool empty (pressWindow): recycles
// under way count first, then the longest-idle warm sandboxes are
// reclaimed for the rest. It returns how many are on their way to the
// pool.
func (m *Manager) Reclaim(language string, n int) int {
	m.mu.Lock()
	coming, more := m.policy.refill(language, n, m.clock.Now())
	var gone []*sandbox
	for len(gone) < more {
		sb := m.reclaimLocked(language)
		if sb == nil {
			break
		}
		gone = append(gone, sb)
	}
	m.mu.Unlock()
	for _, sb := range gone {
		m.startReclaimed(sb)
	}
	return coming + len(gone)
}

// reclaimLocked takes the longest-idle reclaimable warm sandbox of
// language (the policy's reclaim picks it) from its conversation and
// counts it as recycling; nil if there is none. The caller holds m.mu and
// starts its recycle (startReclaimed) once it has let go.
func (m *Manager) reclaimLocked(language string) *sandbox {
	if m.closed {
		return nil
	}
	perConv := map[string]int{}
	for k := range m.warm {
		perConv[k.conversation]++
	}
	var sbs []*sandbox
	var candidates []reclaimable
	for k, sb := range m.warm {
		if k.language != language {
			continue
		}
		sbs = append(sbs, sb)
		candidates = append(candidates, reclaimable{conversation: k.conversation, since: sb.idleFrom, adopted: sb.adopted,
			kept: sb.keeps || sb.keptGen != 0, held: m.held[k.conversation] > 0, shared: perConv[k.conversation] > 1})
	}
	i := m.policy.reclaim(candidates, m.clock.Now())
	if i < 0 {
		return nil
	}
	delete(m.warm, sbs[i].key)
	m.policy.recycleBegan(language)
	return sbs[i]
}

// startReclaimed recycles a reclaimed sandbox in the background.
func (m *Manager) startReclaimed(sb *sandbox) {
	m.log.Debug("reclaiming an idle sandbox for a new conversation", "container", shortID(sb.id),
		"conversation", sb.key.conversation, "idle_ms", time.Since(sb.idleFrom).Milliseconds())
	if !m.goBackground(func() { m.recycleCounted(sb) }) {
		m.recycleCounted(sb) // closed: it is removed, and no longer counted
	}
}

// StartsHeld reports whether the pool filler should start no sandbox of
// language now: new conversations found the pool empty within
// pressWindow, and recycling served each of them — none waited in vain
// and started a sandbox of its own meanwhile. A reset costs a small part
// of a container start's CPU, and a start made during a burst of short
// runs only slows the runs it is for: its CPU is theirs, and the run that
// takes the new sandbox waits for its interpreter to start (cmd/bench's
// burst: p99 305–496 ms with those starts, 154–205 ms without). Runs that
// outlast a start are the other case: a conversation that waited
// adoptGrace in vain ends the hold.
func (m *Manager) StartsHeld(language string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.policy.startsHeld(language, m.clock.Now())
}

// pressedNow says whether new conversations found language's pool empty
// within the last pressWindow, and idle sandboxes may be reclaimed: the
// pool is refilled by recycling then, not by starts. The pool is pressed
// when two new conversations found it empty on arrival within
// pressWindow, not one: one alone is what a refill under way leaves (the
// pool's starts at an executor's start, or the start after a take), and a
// press costs the conversations idle here their sandboxes (the filler
// reclaims them) and stops the pool's starts (StartsHeld). So a lone new
// conversation waits for the start under way, or starts its own, as it
// would without recycling; a burst presses at its second.
func (m *Manager) pressedNow(language string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.policy.pressed(language, m.clock.Now())
}
