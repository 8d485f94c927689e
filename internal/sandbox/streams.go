package sandbox

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net"
	"slices"

	"github.com/runbox-dev/runbox/internal/agent"
)

// Byte streams reach into a sandbox through its agent (package agent,
// mux.go): the sandbox keeps no network. DialPort connects to a port a
// program of a conversation listens on (previews); connections programs
// make to the agent's proxy listener come out through Options.Inbound
// with the run the sandbox was running then (egress). A stream ends with
// its sandbox, and a reset (recycling) ends every stream of it: the next
// conversation inherits none.

// ErrNotListening reports a port no sandbox of the conversation listens on.
var ErrNotListening = errors.New("sandbox: nothing listens on that port")

// Inbound is a connection a program made to its sandbox's proxy listener.
type Inbound struct {
	Conn net.Conn
	// RunID and Conversation name the run the sandbox was running when
	// the program connected: what the executor set, never what the
	// program said. A connection made between runs is never handed on.
	RunID        string
	Conversation string
}

// runTag is the run a sandbox is running, for its inbound connections.
type runTag struct {
	number       uint32 // the agent's count of the run (agent.Conn.NextRun)
	runID        string
	conversation string
}

// DialPort connects to port on the loopback of a sandbox of conversation,
// trying each of its live sandboxes, those running a program first. It
// returns ErrNotListening when none has anything listening there.
func (m *Manager) DialPort(ctx context.Context, conversation string, port int) (net.Conn, error) {
	if port < 1 || port > 65535 {
		return nil, fmt.Errorf("sandbox: port %d out of range", port)
	}
	var failed error
	for _, sb := range m.sandboxesOf(conversation) {
		c, err := sb.conn.Dial(ctx, port)
		if err == nil {
			return c, nil
		}
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		if !errors.Is(err, agent.ErrNotListening) {
			failed = err
		}
	}
	if failed != nil {
		return nil, fmt.Errorf("%w (%w)", ErrNotListening, failed)
	}
	return nil, ErrNotListening
}

// Listening reports whether anything in a live sandbox of conversation
// listens on a TCP port (IPv4 or IPv6).
func (m *Manager) Listening(ctx context.Context, conversation string, port int) (bool, error) {
	if port < 1 || port > 65535 {
		return false, fmt.Errorf("sandbox: port %d out of range", port)
	}
	var failed error
	for _, sb := range m.sandboxesOf(conversation) {
		yes, err := sb.conn.Listening(ctx, port)
		if yes {
			return true, nil
		}
		if err != nil {
			failed = err
		}
	}
	return false, failed
}

// sandboxesOf returns the live sandboxes of a conversation, those running
// a program first.
func (m *Manager) sandboxesOf(conversation string) []*sandbox {
	m.mu.Lock()
	var out []*sandbox
	for sb := range m.open {
		if conversation != "" && sb.key.conversation == conversation && !sb.ended() {
			out = append(out, sb)
		}
	}
	m.mu.Unlock()
	running := func(sb *sandbox) int {
		if sb.running.Load() != nil {
			return 0
		}
		return 1
	}
	slices.SortStableFunc(out, func(a, b *sandbox) int { return cmp.Compare(running(a), running(b)) })
	return out
}

// inbound hands on a proxy connection from sb's agent, made in the
// agent's run number n, if sb runs that run now.
func (m *Manager) inbound(sb *sandbox, c net.Conn, n uint32) {
	tag := sb.running.Load()
	if tag == nil || tag.number != n || m.opts.Inbound == nil {
		c.Close()
		return
	}
	m.opts.Inbound(Inbound{Conn: c, RunID: tag.runID, Conversation: tag.conversation})
}
