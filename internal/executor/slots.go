package executor

import (
	"context"
	"sync"
)

// A run holds one of the executor's slots (EXECUTOR_CONCURRENCY) from
// before it is claimed until it ends — or until it detaches: a parallel
// or detached run gives its slot back once its program has started and
// runs on as an active run (leases, cancel, shutdown and the watchdog
// still apply), up to Config.MaxDetached of them.

// slot is one of the executor's slots, held by a run.
type slot struct {
	once sync.Once
	ch   chan struct{}
}

// takeSlot waits for a free slot.
func (e *Executor) takeSlot(ctx context.Context) (*slot, error) {
	select {
	case e.slots <- struct{}{}:
		return &slot{ch: e.slots}, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// release gives the slot back; only the first call does.
func (s *slot) release() { s.once.Do(func() { <-s.ch }) }

// activeRun is a run the executor has taken and not yet ended.
type activeRun struct {
	conv     string // its conversation, once claimed
	cancel   context.CancelCauseFunc
	ended    chan struct{} // closed when the run has ended
	detached chan struct{} // closed when the run detached
	// conv, isDetached and claimed are guarded by the executor's mu. A run is
	// active from before its claim, which makes its lease: until then the
	// heartbeat must not take the missing lease for one another ended.
	isDetached bool
	claimed    bool
}

// keyedMutex is a mutex per key (a conversation), kept while in use.
type keyedMutex struct {
	mu sync.Mutex
	m  map[string]*keyedEntry
}

type keyedEntry struct {
	mu    sync.Mutex
	users int
}

// lock holds key's mutex until unlock.
func (k *keyedMutex) lock(key string) (unlock func()) {
	k.mu.Lock()
	en := k.m[key]
	if en == nil {
		en = &keyedEntry{}
		k.m[key] = en
	}
	en.users++
	k.mu.Unlock()
	en.mu.Lock()
	return func() {
		en.mu.Unlock()
		k.mu.Lock()
		if en.users--; en.users == 0 {
			delete(k.m, key)
		}
		k.mu.Unlock()
	}
}

// recentRuns are the ids of the last runs that ended here, at most
// recentMax: asynq hands out the task of a run this executor took when it
// was announced (wake.go), often after the run has ended, and its claim
// would only find it ended in the store.
type recentRuns struct {
	ids  map[string]struct{}
	ring []string // oldest first once full
	next int
}

const recentMax = 1024

func (r *recentRuns) add(id string) {
	if r.ids == nil {
		r.ids, r.ring = map[string]struct{}{}, make([]string, 0, recentMax)
	}
	if _, ok := r.ids[id]; ok {
		return
	}
	if len(r.ring) < recentMax {
		r.ring = append(r.ring, id)
	} else {
		delete(r.ids, r.ring[r.next])
		r.ring[r.next] = id
		r.next = (r.next + 1) % recentMax
	}
	r.ids[id] = struct{}{}
}

func (r *recentRuns) has(id string) bool {
	_, ok := r.ids[id]
	return ok
}
