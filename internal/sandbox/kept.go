package sandbox

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/runbox-dev/runbox/internal/agent"
	"github.com/runbox-dev/runbox/internal/snapshot"
)

// A conversation's kept interpreter outlives its sandbox (package
// snapshot): when a sandbox holding one goes for any reason but the
// conversation's close or the interpreter's death — idle past its TTL,
// evicted for room, its executor stopping, a pause asked for — its state
// is saved first (pauseKept); the conversation's next kept-state cell, in
// a sandbox without an interpreter, restores it before it runs
// (resumeKept).

// StateKeeper keeps conversations' kept interpreters across sandboxes
// (snapshot.Keeper).
type StateKeeper interface {
	Pause(ctx context.Context, conv string, gen int64, in snapshot.Interpreter) (snapshot.Paused, error)
	Resume(ctx context.Context, conv string, in snapshot.Interpreter) (snapshot.Resumed, error)
}

// PauseTimeout bounds a pause: a large state takes seconds to save.
const PauseTimeout = 2 * time.Minute

// Paused is what Pause kept.
type Paused struct {
	Paused bool
	Size   int64
	Lost   []string
}

// pauseKept saves the state of sb's kept interpreter, if it has one, as
// sb goes.
func (m *Manager) pauseKept(sb *sandbox) (Paused, error) {
	gen, conv := sb.keptGen, sb.key.conversation
	if m.opts.State == nil || gen == 0 || sb.ended() {
		return Paused{}, nil
	}
	sb.keptGen = 0
	ctx, cancel := context.WithTimeout(context.Background(), PauseTimeout)
	defer cancel()
	begin := time.Now()
	p, err := m.opts.State.Pause(ctx, conv, gen, sb.conn)
	switch {
	case errors.Is(err, agent.ErrNoState) || errors.Is(err, snapshot.ErrSuperseded):
		return Paused{}, nil
	case err != nil:
		m.log.Warn("could not save a kept interpreter's state", "conversation", conv, "container", shortID(sb.id), "err", err)
		return Paused{}, err
	}
	m.log.Info("saved a kept interpreter's state", "conversation", conv, "bytes", p.Size,
		"lost", p.Saved.LostCount, "ms", time.Since(begin).Milliseconds())
	return Paused{Paused: true, Size: p.Size, Lost: p.Saved.Lost}, nil
}

// resumeKept restores, before a kept-state cell, the conversation's saved
// state in sb, if sb has no interpreter of it yet. An error leaves the
// cell to start a fresh interpreter.
func (m *Manager) resumeKept(ctx context.Context, sb *sandbox, req Request, oc *Outcome) {
	if m.opts.State == nil || !req.KeepState || sb.keptGen != 0 {
		return
	}
	begin := time.Now()
	r, err := m.opts.State.Resume(ctx, req.ConversationID, sb.conn)
	sb.keptGen = r.Gen
	if err != nil {
		m.log.Warn("could not restore a kept interpreter's state", "conversation", req.ConversationID, "err", err)
		return
	}
	if r.Restored {
		oc.StateRestored, oc.LostVariables = true, r.State.Lost
		m.log.Info("restored a kept interpreter's state", "conversation", req.ConversationID,
			"lost", r.State.LostCount, "ms", time.Since(begin).Milliseconds())
	}
}

// keptAfter notes whether sb's kept interpreter lives on after a run.
func (sb *sandbox) keptAfter(req Request, oc Outcome) {
	if req.KeepState && (oc.StateLost || oc.Kernel == "") {
		sb.keptGen = 0
	}
}

// Pause saves the state of the conversation's kept interpreter, if one
// runs here idle, and lets its sandbox go. Paused.Paused is false when
// there was none to save.
func (m *Manager) Pause(conversation string) (Paused, error) {
	return m.pauseWhere(func(sb *sandbox) bool { return sb.key.conversation == conversation })
}

// PauseAll saves the state of every kept interpreter idle here and lets
// their sandboxes go: the executor stops, and from then on their
// conversations go to other executors, which restore it.
func (m *Manager) PauseAll() error {
	_, err := m.pauseWhere(func(*sandbox) bool { return true })
	return err
}

// pauseWhere pauses the idle kept interpreters of the sandboxes that
// match; it returns what one of them kept.
func (m *Manager) pauseWhere(match func(*sandbox) bool) (Paused, error) {
	gone := m.unwarm(func(sb *sandbox) bool { return sb.keptGen != 0 && match(sb) })
	var (
		mu   sync.Mutex
		out  Paused
		errs []error
	)
	each(gone, func(sb *sandbox) {
		p, err := m.pauseKept(sb)
		mu.Lock()
		if p.Paused {
			out = p
		}
		errs = append(errs, err)
		mu.Unlock()
		m.background(sb, m.recycle)
	})
	return out, errors.Join(errs...)
}
