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
	conv     string // its conversation
	cancel   context.CancelCauseFunc
	ended    chan struct{} // closed when the run has ended
	detached chan struct{} // closed when the run detached
	// isDetached and claimed are guarded by the executor's mu. A run is
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
