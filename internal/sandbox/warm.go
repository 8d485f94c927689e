package sandbox

import (
	"fmt"
	"syscall"
	"time"

	"github.com/moby/moby/client"

	"github.com/runbox-dev/runbox/internal/agent"
)

// warmKey names the sandboxes a run may use: its conversation's, in its
// language.
type warmKey struct {
	conversation, language string
}

// fileID identifies a folder across renames: what a bind mount holds on to.
type fileID struct {
	dev, ino uint64
}

func dirID(path string) (fileID, error) {
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		return fileID{}, err
	}
	return fileID{dev: uint64(st.Dev), ino: st.Ino}, nil
}

// sandbox is one started container and the agent in it.
type sandbox struct {
	m        *Manager
	id       string
	key      warmKey
	data     fileID // the folder mounted at /data
	attach   client.HijackedResponse
	conn     *agent.Conn
	agentErr *logWriter
	idleFrom time.Time
}

// take returns the conversation's idle sandbox, if it still mounts the
// conversation's folder as it is now (not one deleted and made anew, nor a
// disk image unmounted and mounted again).
func (m *Manager) take(key warmKey, dataDir string) *sandbox {
	m.mu.Lock()
	sb := m.warm[key]
	delete(m.warm, key)
	m.mu.Unlock()
	if sb == nil {
		return nil
	}
	if id, err := dirID(dataDir); err != nil || id != sb.data {
		go m.discard(sb)
		return nil
	}
	return sb
}

// park keeps a sandbox for its conversation's next run, making room if
// there are too many.
func (m *Manager) park(sb *sandbox) {
	sb.idleFrom = time.Now()
	m.mu.Lock()
	prev := m.warm[sb.key]
	m.warm[sb.key] = sb
	var evict []*sandbox
	if prev != nil && prev != sb {
		evict = append(evict, prev)
	}
	for len(m.warm) > m.opts.MaxWarm {
		oldest := sb
		for _, w := range m.warm {
			if w.idleFrom.Before(oldest.idleFrom) {
				oldest = w
			}
		}
		delete(m.warm, oldest.key)
		evict = append(evict, oldest)
	}
	m.mu.Unlock()
	for _, w := range evict {
		go m.discard(w)
	}
}

// discard removes a sandbox for good.
func (m *Manager) discard(sb *sandbox) {
	sb.attach.Close()
	m.remove(sb.id)
}

// Prune removes the warm sandboxes idle for longer than the TTL.
func (m *Manager) Prune() int {
	return m.drop(func(sb *sandbox) bool { return time.Since(sb.idleFrom) > m.opts.IdleTTL })
}

// Drop removes a conversation's warm sandboxes: it was closed.
func (m *Manager) Drop(conversation string) int {
	return m.drop(func(sb *sandbox) bool { return sb.key.conversation == conversation })
}

// Close removes every warm sandbox.
func (m *Manager) Close() int {
	return m.drop(func(*sandbox) bool { return true })
}

func (m *Manager) drop(match func(*sandbox) bool) int {
	m.mu.Lock()
	var gone []*sandbox
	for k, sb := range m.warm {
		if match(sb) {
			gone = append(gone, sb)
			delete(m.warm, k)
		}
	}
	m.mu.Unlock()
	for _, sb := range gone {
		m.discard(sb)
	}
	return len(gone)
}

// Warm returns how many sandboxes wait for their conversations.
func (m *Manager) Warm() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.warm)
}

// String describes a sandbox for logs.
func (sb *sandbox) String() string {
	return fmt.Sprintf("%s (%s, %s)", shortID(sb.id), sb.key.conversation, sb.key.language)
}
