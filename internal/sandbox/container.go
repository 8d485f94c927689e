package sandbox

import (
	"cmp"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"net"
	"os"
	"path"
	"path/filepath"
	"strings"
	"time"

	"github.com/runbox-dev/runbox"
	"github.com/runbox-dev/runbox/internal/agent"
	"github.com/runbox-dev/runbox/internal/sandbox/engine"
)

// spec is the sandbox req runs in.
func (m *Manager) spec(runner runbox.Runner, req Request) engine.Spec {
	limits := m.opts.Limits
	if strings.HasPrefix(req.Language, TemplateKey("")) {
		// The security gateway's bounds of a project's sandbox.
		limits.Memory = min(limits.Memory, TemplateMemory)
		limits.NanoCPUs = min(limits.NanoCPUs, TemplateNanoCPUs)
	}
	tmpfs := []engine.Tmpfs{{Target: "/tmp", Size: tmpfsSize}}
	m.mu.Lock()
	if size := m.execTmpfs[runner.Language]; size != "" {
		// Executable: compiled programs run from here. Its pages count
		// against the sandbox's memory, as /tmp's do.
		tmpfs = append(tmpfs, engine.Tmpfs{Target: ExecDir, Size: size, Exec: true, Private: true})
	}
	m.mu.Unlock()
	return engine.Spec{
		// A conversation key may hold '~', and a template's key '@', which
		// names may not.
		Name: "runbox-" + strings.ReplaceAll(cmp.Or(req.ConversationID, "pool"), "~", ".") + "-" +
			strings.ReplaceAll(req.Language, "@", "template-") + "-" + strings.ToLower(rand.Text()[:8]),
		Image:   runner.Image,
		User:    User,
		WorkDir: "/data",
		Labels: map[string]string{
			LabelManaged:      "true",
			LabelExecutor:     m.opts.ExecutorID,
			LabelDeployment:   m.opts.Deployment,
			LabelRun:          req.RunID,
			LabelConversation: req.ConversationID,
		},
		Limits: engine.Limits{Memory: limits.Memory, NanoCPUs: limits.NanoCPUs, Pids: limits.Pids,
			OpenFiles: openFiles, FileSize: limits.FileSize},
		Tmpfs:  tmpfs,
		Mounts: []engine.Mount{{Source: req.DataDir, Target: "/data"}},
	}
}

// openFiles bounds each program's open files.
const openFiles = 1024

// A template's sandbox (a project) gets at most 512 MB and half a core.
const (
	TemplateMemory   = 512 << 20
	TemplateNanoCPUs = 5e8
)

// CheckRuntime checks that a sandbox of image (a runner) starts and exits
// under the engine's runtime. An executor calls it at start, so that a
// runtime that is missing or broken stops it with one clear line rather
// than failing every run.
func (m *Manager) CheckRuntime(ctx context.Context, image string) error {
	return m.engine.Check(ctx, engine.Spec{Image: image, User: User,
		Labels: map[string]string{LabelManaged: "true", LabelExecutor: m.opts.ExecutorID, LabelDeployment: m.opts.Deployment}})
}

// create makes, attaches to and starts a container, and waits for its
// agent's hello. Any failure removes the container.
func (m *Manager) create(ctx context.Context, runner runbox.Runner, req Request) (_ *sandbox, err error) {
	id, err := dirID(req.DataDir)
	if err != nil {
		return nil, fmt.Errorf("inspect data folder: %w", err)
	}
	spec := m.spec(runner, req)
	sockets, err := m.socketFolder()
	if err != nil {
		return nil, err
	}
	if sockets != "" {
		defer func() {
			if err != nil {
				_ = os.RemoveAll(sockets)
			}
		}()
		spec.Mounts = append(spec.Mounts, engine.Mount{Source: sockets, Target: path.Dir(agent.ProxySocket), ReadOnly: true})
	}
	// Standard output is the protocol; standard error the agent's own
	// complaints, logged.
	agentErr := newLogWriter(m.log)
	att, err := m.engine.Create(ctx, spec, agentErr)
	if err != nil {
		return nil, err
	}
	agentErr.named(shortID(att.ID))
	m.track(att.ID)
	defer func() {
		if err != nil {
			att.Closer.Close()
			m.remove(att.ID)
		}
	}()
	sb := &sandbox{
		m: m, id: att.ID, key: warmKey{conversation: req.ConversationID, language: req.Language}, data: id,
		attach: att.Closer, conn: agent.NewConn(att.Stdout, att.Stdin), agentErr: agentErr, dataDir: req.DataDir,
		sockets: sockets, done: att.Done,
	}
	sb.conn.OnProxy(func(c net.Conn, run uint32) { m.inbound(sb, c, run) })
	if sockets != "" {
		if err := sb.conn.ListenProxy(filepath.Join(sockets, path.Base(agent.ProxySocket))); err != nil {
			sb.conn.Close()
			return nil, err
		}
	}

	hello := make(chan error, 1)
	go func() { _, err := sb.conn.Hello(); hello <- err }()
	t := time.NewTimer(helloTimeout)
	defer t.Stop()
	select {
	case err = <-hello:
	case <-ctx.Done():
		err = ctx.Err()
	case <-t.C:
		err = errors.New("agent did not answer")
	}
	if err != nil {
		return nil, fmt.Errorf("start sandbox: %w", err)
	}
	m.mu.Lock()
	m.open[sb] = struct{}{}
	m.mu.Unlock()
	return sb, nil
}

// socketName is the length of the name of a sandbox's socket folder.
const socketName = 10

// socketFolder makes the folder of a new sandbox's proxy socket, if
// sandboxes get one (Options.Sockets).
func (m *Manager) socketFolder() (string, error) {
	if m.opts.Sockets == "" {
		return "", nil
	}
	dir := filepath.Join(m.opts.Sockets, strings.ToLower(rand.Text()[:socketName]))
	// Traversable by the sandbox's user, whichever the agent runs as.
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", fmt.Errorf("create proxy socket folder: %w", err)
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		return "", fmt.Errorf("create proxy socket folder: %w", err)
	}
	return dir, nil
}

func (m *Manager) track(id string) {
	m.mu.Lock()
	m.live[id] = struct{}{}
	m.mu.Unlock()
}

// kill stops a sandbox now. It is called from timers and cancellation,
// so it uses its own context.
func (m *Manager) kill(id string) {
	ctx, cancel := context.WithTimeout(context.Background(), removeTimeout)
	defer cancel()
	if err := m.engine.Kill(ctx, id); err != nil {
		m.log.Warn("kill sandbox", "container", shortID(id), "err", err)
	}
}

// remove deletes a sandbox whatever its state, on a context of its own:
// cleanup must not depend on the request that is ending.
func (m *Manager) remove(id string) {
	m.forceRemove(id)
	m.mu.Lock()
	delete(m.live, id)
	m.mu.Unlock()
}

func (m *Manager) forceRemove(id string) {
	ctx, cancel := context.WithTimeout(context.Background(), removeTimeout)
	defer cancel()
	if err := m.engine.Remove(ctx, id); err != nil {
		m.log.Error("remove sandbox", "container", shortID(id), "err", err)
	}
}
