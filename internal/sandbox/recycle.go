package sandbox

import (
	"errors"
	"time"

	"github.com/runbox-dev/runbox/internal/agent"
)

// An idle sandbox evicted from its conversation (the warm limit, or its
// idle TTL) is not removed but recycled into its language's pool while the
// pool has room: its agent resets it (reset.go of package agent: no
// process, file, IPC object or interpreter of the conversation is left,
// each checked), the executor takes the folder it mounts away from the
// conversation and empties it (Options.Recycle), and the next new
// conversation adopts it as it would a pre-started one — without a
// container start. Anything not shown clean removes the sandbox instead.

// ErrSpoiled, from a pooled sandbox's adopt func, says that its folder
// could not be given back empty: the sandbox is removed.
var ErrSpoiled = errors.New("the sandbox's folder could not be restored")

// resetTimeout bounds a reset; past it the sandbox is removed. A reset
// takes well under a second, but under gVisor on a busy 2-core machine one
// was seen past 10 s (a slow reset costs nothing but its sandbox's wait).
const resetTimeout = 20 * time.Second

// recycle resets an evicted sandbox into the pool, or removes it.
func (m *Manager) recycle(sb *sandbox) {
	// It leaves its conversation: the state goes with it. Only then is it
	// counted as coming: a save takes seconds, a start would be sooner.
	_, _ = m.pauseKept(sb)
	m.mu.Lock()
	m.policy.recycleBegan(sb.key.language)
	m.mu.Unlock()
	m.recycleCounted(sb)
}

// recycleCounted is recycle of a sandbox without a kept interpreter to
// save, counted as recycling already: new conversations that find the
// pool empty wait for it rather than start a sandbox of their own
// (nextPooled), until it joins the pool or is removed.
func (m *Manager) recycleCounted(sb *sandbox) {
	lang, conv := sb.key.language, sb.key.conversation
	counted := true // until it joins the pool (joinPool)
	defer func() {
		if counted {
			m.mu.Lock()
			m.policy.recycleDropped(lang)
			m.poolChangedLocked()
			m.mu.Unlock()
		}
	}()
	if m.opts.Recycle == nil || sb.ended() || m.Pooled(lang) >= m.opts.MaxPool.For(lang) {
		m.discard(sb)
		return
	}
	// No longer its conversation's: no stream is dialled into it, and the
	// reset ends those open.
	m.mu.Lock()
	sb.key = warmKey{language: lang}
	m.mu.Unlock()
	begin := time.Now()
	if r, err := sb.reset(); err != nil || !r.Clean {
		m.log.Info("not recycling a sandbox", "container", shortID(sb.id), "reason", r.Reason, "err", err)
		m.discard(sb)
		return
	}
	reset := time.Since(begin)
	sb.keeps = false
	// Asked under the folder's lock: no other sandbox of the conversation
	// may mount the folder about to become a slot. A run that starts
	// meanwhile marks the folder used first (files.Folders.Ensure), which
	// Recycle sees.
	slot, err := m.opts.Recycle(conv, func(dir string) bool {
		if m.HasSandbox(conv) {
			return false
		}
		id, err := dirID(dir)
		return err == nil && id == sb.data
	}, sb.idleFrom)
	if err != nil {
		m.log.Info("not recycling a sandbox", "container", shortID(sb.id), "err", err)
		m.discard(sb)
		return
	}
	sb.dataDir = slot
	counted = false
	if m.joinPool(lang, sb, true) != nil {
		return
	}
	m.demand.recycled(lang, time.Since(begin))
	m.log.Debug("recycled a sandbox", "container", shortID(sb.id),
		"reset_ms", reset.Milliseconds(), "total_ms", time.Since(begin).Milliseconds())
}

// reset asks the agent to reset the sandbox and waits for its answer; a
// sandbox that does not answer in time is killed.
func (sb *sandbox) reset() (agent.Reset, error) {
	timer := time.AfterFunc(resetTimeout, func() { sb.m.kill(sb.id) })
	defer timer.Stop()
	if err := sb.conn.Reset(); err != nil {
		return agent.Reset{}, err
	}
	for {
		msg, err := sb.conn.Recv()
		if err != nil {
			return agent.Reset{}, err
		}
		if msg.Kind == agent.ResetDone {
			if err := sb.conn.ResumeProxy(); err != nil {
				sb.m.log.Warn("proxy socket", "container", shortID(sb.id), "err", err)
			}
			return msg.Reset, nil
		}
		// Output of the conversation's last run, late: it is not the next
		// one's to see, and it is dropped here.
	}
}
