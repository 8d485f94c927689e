package sandbox

import (
	"context"
	"errors"
	"fmt"

	"github.com/runbox-dev/runbox"
	"github.com/runbox-dev/runbox/internal/sandbox/engine"
)

// An engine whose sandboxes share a bounded room (Kubernetes: a node's
// allocatable CPU and memory, which every pod's requests take from, idle
// or not) can be full of this executor's own idle sandboxes: with the
// default MaxWarm a small node's CPU is taken by warm pods long before
// their limit is reached. The engine then says so at once (engine.ErrNoRoom)
// rather than leave a new sandbox waiting for room that would never come,
// and a run's start makes room by removing idle sandboxes, as a warm
// limit would: the warm one idle longest first (its kept state saved),
// then pooled ones. Never removed: a warm sandbox adopted by a new
// conversation whose run has not taken it yet (its run would start a
// sandbox of its own, as reclaim.go's filter says), nor one in use. The
// pool never makes room (Prestart): an idle sandbox of a conversation is
// worth more than one for a conversation that has not come.

// roomTries bounds the idle sandboxes removed to make room for one
// start: a sandbox larger than those removed (a template's) may need
// several, but room taken by something else than this executor's idle
// sandboxes is not freed by removing more of them.
const roomTries = 4

// createRoom creates req's sandbox, making room for it when the engine
// has none (freeRoom) and trying again, roomTries times at most. When no
// idle sandbox is left to remove, or the tries are spent, the error says
// so and wraps engine.ErrNoRoom.
func (m *Manager) createRoom(ctx context.Context, runner runbox.Runner, req Request) (*sandbox, error) {
	m.mu.Lock()
	m.roomWanted++
	m.mu.Unlock()
	defer func() {
		m.mu.Lock()
		m.roomWanted--
		m.mu.Unlock()
	}()
	for freed := 0; ; freed++ {
		sb, err := m.create(ctx, runner, req)
		if !errors.Is(err, engine.ErrNoRoom) {
			return sb, err
		}
		if freed == roomTries {
			return nil, fmt.Errorf("start a sandbox: still no room after removing %d idle sandboxes: %w", freed, err)
		}
		if ctx.Err() != nil {
			return nil, err
		}
		gone := m.freeRoom(req.Language)
		if gone == nil {
			return nil, fmt.Errorf("start a sandbox: every sandbox here is in use (%d idle removed): %w", freed, err)
		}
		m.log.Info("removed an idle sandbox to make room for another", "removed", gone.String(),
			"conversation", req.ConversationID, "language", req.Language, "try", freed+1)
	}
}

// freeRoom removes one idle sandbox to make room for one of lang: the warm
// one idle longest, of lang if there is one (the same size as the one to
// start), else of any language, with its kept state saved first, as an
// eviction does; else a pooled one, from the largest pool. A warm one
// adopted by a new conversation whose run has not taken it yet is never
// removed: that run would start a sandbox of its own. It returns the one
// it removed, or nil if there was none.
func (m *Manager) freeRoom(lang string) *sandbox {
	m.mu.Lock()
	var oldest *sandbox
	for _, sb := range m.warm {
		if sb.adopted {
			continue
		}
		if oldest == nil || roomFirst(sb, oldest, lang) {
			oldest = sb
		}
	}
	if oldest != nil {
		delete(m.warm, oldest.key)
		m.mu.Unlock()
		_, _ = m.pauseKept(oldest) // it leaves its conversation: the state goes with it
		m.discard(oldest)
		return oldest
	}
	pooled, ok := m.policy.popForRoom()
	m.mu.Unlock()
	if !ok {
		return nil
	}
	m.discard(pooled)
	return pooled
}

// roomFirst reports whether a goes before b when making room for a
// sandbox of lang: one of lang before one of another language, then the
// one idle longer.
func roomFirst(a, b *sandbox, lang string) bool {
	if sameA, sameB := a.key.language == lang, b.key.language == lang; sameA != sameB {
		return sameA
	}
	return a.idleFrom.Before(b.idleFrom)
}

// errRoomWanted, from Prestart, says that a run is making room for its
// sandbox: the pool would take the room it makes.
var errRoomWanted = fmt.Errorf("a run is making room for its sandbox: %w", engine.ErrNoRoom)
