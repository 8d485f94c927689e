package sandbox

import (
	"cmp"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path"
	"path/filepath"
	"strings"
	"time"

	"github.com/containerd/errdefs"
	"github.com/moby/moby/api/pkg/stdcopy"
	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/api/types/mount"
	"github.com/moby/moby/client"

	"github.com/runbox-dev/runbox"
	"github.com/runbox-dev/runbox/internal/agent"
)

func (m *Manager) containerConfig(runner runbox.Runner, req Request) client.ContainerCreateOptions {
	limits := m.opts.Limits
	if strings.HasPrefix(req.Language, TemplateKey("")) {
		// The security gateway's bounds of a project's sandbox.
		limits.Memory = min(limits.Memory, TemplateMemory)
		limits.NanoCPUs = min(limits.NanoCPUs, TemplateNanoCPUs)
	}
	pids := limits.Pids
	tmpfs := map[string]string{"/tmp": "rw,nosuid,nodev,noexec,size=" + tmpfsSize}
	m.mu.Lock()
	if size := m.execTmpfs[runner.Language]; size != "" {
		// Without noexec: compiled programs run from here. Its pages
		// count against the sandbox's memory, as /tmp's do.
		tmpfs[ExecDir] = fmt.Sprintf("rw,nosuid,nodev,exec,size=%s,uid=%d,gid=%d,mode=0700", size, UID, GID)
	}
	m.mu.Unlock()
	opts := client.ContainerCreateOptions{
		// A conversation key may hold '~', and a template's key '@', which
		// container names may not.
		Name: "runbox-" + strings.ReplaceAll(cmp.Or(req.ConversationID, "pool"), "~", ".") + "-" +
			strings.ReplaceAll(req.Language, "@", "template-") + "-" + strings.ToLower(rand.Text()[:8]),
		Config: &container.Config{
			Image:           runner.Image,
			User:            User,
			WorkingDir:      "/data",
			AttachStdin:     true,
			AttachStdout:    true,
			AttachStderr:    true,
			OpenStdin:       true,
			StdinOnce:       true,
			NetworkDisabled: true,
			Labels: map[string]string{
				LabelManaged:      "true",
				LabelExecutor:     m.opts.ExecutorID,
				LabelDeployment:   m.opts.Deployment,
				LabelRun:          req.RunID,
				LabelConversation: req.ConversationID,
			},
		},
		HostConfig: &container.HostConfig{
			NetworkMode:    "none",
			CapDrop:        []string{"ALL"},
			SecurityOpt:    []string{"no-new-privileges:true"},
			ReadonlyRootfs: true,
			Tmpfs:          tmpfs,
			IpcMode:        "private",
			// The agent is PID 1 and reaps orphans itself: docker-init
			// would run as the programs' user, within their reach.
			Init: &noInit,
			// What a program prints reaches the executor through the
			// agent's frames; nothing of it is kept on the host's disk.
			LogConfig: container.LogConfig{Type: "none"},
			Mounts: []mount.Mount{{
				Type:   mount.TypeBind,
				Source: req.DataDir,
				Target: "/data",
			}},
			Resources: container.Resources{
				Memory:     limits.Memory,
				MemorySwap: limits.Memory,
				NanoCPUs:   limits.NanoCPUs,
				PidsLimit:  &pids,
				Ulimits:    m.ulimits(),
			},
		},
	}
	m.opts.Runtime.configure(opts.Config, opts.HostConfig)
	return opts
}

var noInit = false

// A template's sandbox (a project) gets at most 512 MB and half a core.
const (
	TemplateMemory   = 512 << 20
	TemplateNanoCPUs = 5e8
)

func (m *Manager) ulimits() []*container.Ulimit {
	u := []*container.Ulimit{
		{Name: "nofile", Soft: 1024, Hard: 1024},
		{Name: "core", Soft: 0, Hard: 0},
	}
	if fs := m.opts.Limits.FileSize; fs > 0 {
		u = append(u, &container.Ulimit{Name: "fsize", Soft: fs, Hard: fs})
	}
	return u
}

// create makes, attaches to and starts a container, and waits for its
// agent's hello. Any failure removes the container.
func (m *Manager) create(ctx context.Context, runner runbox.Runner, req Request) (_ *sandbox, err error) {
	id, err := dirID(req.DataDir)
	if err != nil {
		return nil, fmt.Errorf("inspect data folder: %w", err)
	}
	opts := m.containerConfig(runner, req)
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
		opts.HostConfig.Mounts = append(opts.HostConfig.Mounts, mount.Mount{
			Type: mount.TypeBind, Source: sockets, Target: path.Dir(agent.ProxySocket), ReadOnly: true,
		})
	}
	// Not cancelled midway: the daemon would go on to create a container
	// whose id we would never learn.
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), removeTimeout)
	created, err := m.docker.ContainerCreate(cctx, opts)
	cancel()
	if err != nil {
		return nil, fmt.Errorf("create container: %w", err)
	}
	m.track(created.ID)
	if err := ctx.Err(); err != nil {
		m.remove(created.ID)
		return nil, err
	}
	defer func() {
		if err != nil {
			m.remove(created.ID)
		}
	}()
	// Attach before start, or early output is lost.
	att, err := m.docker.ContainerAttach(ctx, created.ID, client.ContainerAttachOptions{
		Stream: true, Stdin: true, Stdout: true, Stderr: true,
	})
	if err != nil {
		return nil, fmt.Errorf("attach container: %w", err)
	}
	defer func() {
		if err != nil {
			att.Close()
		}
	}()
	if _, err := m.docker.ContainerStart(ctx, created.ID, client.ContainerStartOptions{}); err != nil {
		return nil, fmt.Errorf("start container: %w", err)
	}

	// The attach stream multiplexes stdout (the protocol) and stderr (the
	// agent's own complaints, logged).
	pr, pw := io.Pipe()
	agentErr := newLogWriter(m.log.With("container", shortID(created.ID)))
	sb := &sandbox{
		m: m, id: created.ID, key: warmKey{conversation: req.ConversationID, language: req.Language}, data: id,
		attach: att.HijackedResponse, conn: agent.NewConn(pr, att.Conn), agentErr: agentErr, dataDir: req.DataDir,
		sockets: sockets,
	}
	sb.conn.OnProxy(func(c net.Conn, run uint32) { m.inbound(sb, c, run) })
	if sockets != "" {
		if err := sb.conn.ListenProxy(filepath.Join(sockets, path.Base(agent.ProxySocket))); err != nil {
			sb.conn.Close()
			return nil, err
		}
	}
	go func() {
		_, err := stdcopy.StdCopy(pw, agentErr, att.Reader)
		// The container stopped, or the engine went away (restarted):
		// the sandbox is of no more use.
		sb.dead.Store(true)
		pw.CloseWithError(err)
	}()

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

// kill stops a container now. It is called from timers and cancellation,
// so it uses its own context.
func (m *Manager) kill(id string) {
	ctx, cancel := context.WithTimeout(context.Background(), removeTimeout)
	defer cancel()
	if _, err := m.docker.ContainerKill(ctx, id, client.ContainerKillOptions{Signal: "KILL"}); err != nil &&
		!errdefs.IsNotFound(err) && !errdefs.IsConflict(err) {
		m.log.Warn("kill sandbox", "container", shortID(id), "err", err)
	}
}

// remove deletes a container whatever its state, on a context of its own:
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
	for attempt := 0; ; attempt++ {
		_, err := m.docker.ContainerRemove(ctx, id, client.ContainerRemoveOptions{Force: true, RemoveVolumes: true})
		if err == nil || errdefs.IsNotFound(err) {
			return
		}
		// "removal already in progress" and similar pass quickly.
		if attempt == 4 || ctx.Err() != nil {
			m.log.Error("remove sandbox", "container", shortID(id), "err", err)
			return
		}
		time.Sleep(time.Duration(100<<attempt) * time.Millisecond)
	}
}
