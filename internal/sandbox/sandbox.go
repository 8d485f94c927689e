// Package sandbox runs programs in locked-down Docker containers.
//
// A container runs the runner agent (package agent) as its command; the
// Manager talks to it over the container's attached stdin and stdout. How a
// container is obtained for a run (today: a fresh one per run) is the
// Manager's business alone: callers only ask it to Run.
package sandbox

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/containerd/errdefs"
	"github.com/moby/moby/api/pkg/stdcopy"
	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/api/types/mount"
	"github.com/moby/moby/client"

	"github.com/runbox-dev/runbox"
	"github.com/runbox-dev/runbox/internal/agent"
)

// Labels of runner images (the contract's) and of the containers the
// executor starts (ours).
const (
	LabelRunner   = "sandbox.runner"
	LabelLanguage = "sandbox.language"
	LabelVersion  = "sandbox.version"

	LabelManaged      = "runbox.managed"
	LabelExecutor     = "runbox.executor"
	LabelRun          = "runbox.run"
	LabelConversation = "runbox.conversation"
)

// User is the uid:gid programs run as. Conversation folders are made
// writable for it.
const User = "1000:1000"

// UID and GID of User.
const (
	UID = 1000
	GID = 1000
)

const (
	helloTimeout  = 30 * time.Second // container start and agent boot
	removeTimeout = 30 * time.Second
	tmpfsSize     = "64m"
)

// Docker is the part of the Docker Engine API the sandbox uses;
// *client.Client implements it.
type Docker interface {
	ContainerCreate(ctx context.Context, options client.ContainerCreateOptions) (client.ContainerCreateResult, error)
	ContainerAttach(ctx context.Context, id string, options client.ContainerAttachOptions) (client.ContainerAttachResult, error)
	ContainerStart(ctx context.Context, id string, options client.ContainerStartOptions) (client.ContainerStartResult, error)
	ContainerKill(ctx context.Context, id string, options client.ContainerKillOptions) (client.ContainerKillResult, error)
	ContainerRemove(ctx context.Context, id string, options client.ContainerRemoveOptions) (client.ContainerRemoveResult, error)
	ContainerInspect(ctx context.Context, id string, options client.ContainerInspectOptions) (client.ContainerInspectResult, error)
	ContainerList(ctx context.Context, options client.ContainerListOptions) (client.ContainerListResult, error)
	ImageList(ctx context.Context, options client.ImageListOptions) (client.ImageListResult, error)
	Ping(ctx context.Context, options client.PingOptions) (client.PingResult, error)
}

// Limits bound every sandbox.
type Limits struct {
	Memory   int64 // bytes; swap is not allowed on top
	NanoCPUs int64
	Pids     int64
	// FileSize bounds any one file a program writes (RLIMIT_FSIZE); 0 is
	// no bound.
	FileSize int64
}

// Options configure a Manager.
type Options struct {
	ExecutorID string // labels the containers, so that a restart can reap them
	Limits     Limits
	Logger     *slog.Logger
}

// Manager runs programs in sandboxes.
type Manager struct {
	docker Docker
	opts   Options
	log    *slog.Logger

	mu      sync.Mutex
	runners map[string]runbox.Runner // by language
	live    map[string]struct{}      // containers started and not yet removed
}

// NewManager returns a Manager using docker.
func NewManager(docker Docker, opts Options) *Manager {
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Manager{docker: docker, opts: opts, log: log, runners: map[string]runbox.Runner{}, live: map[string]struct{}{}}
}

// Ping checks that the Docker Engine answers.
func (m *Manager) Ping(ctx context.Context) error {
	_, err := m.docker.Ping(ctx, client.PingOptions{})
	return err
}

// Discover finds the runner images by their labels and returns their
// languages. Where several images offer a language, the one tagged
// runner-<language> wins.
func (m *Manager) Discover(ctx context.Context) ([]runbox.Runner, error) {
	res, err := m.docker.ImageList(ctx, client.ImageListOptions{
		Filters: client.Filters{}.Add("label", LabelRunner+"=true"),
	})
	if err != nil {
		return nil, fmt.Errorf("list runner images: %w", err)
	}
	found := map[string]runbox.Runner{}
	for _, img := range res.Items {
		lang := img.Labels[LabelLanguage]
		if lang == "" || len(img.RepoTags) == 0 {
			continue
		}
		tag := img.RepoTags[0]
		for _, t := range img.RepoTags {
			if t == "runner-"+lang+":latest" {
				tag = t
			}
		}
		if prev, ok := found[lang]; ok && prev.Image == "runner-"+lang+":latest" {
			continue
		}
		found[lang] = runbox.Runner{Language: lang, Image: tag, Version: img.Labels[LabelVersion]}
	}
	m.mu.Lock()
	m.runners = found
	m.mu.Unlock()
	out := slices.Collect(maps.Values(found))
	slices.SortFunc(out, func(a, b runbox.Runner) int { return cmp.Compare(a.Language, b.Language) })
	return out, nil
}

// Request is a program to run.
type Request struct {
	RunID          string
	ConversationID string
	Language       string
	Code           string
	Env            map[string]string
	// Stdin is the program's input; nil means none. The program sees EOF
	// when Stdin does.
	Stdin   io.Reader
	Timeout time.Duration
	// DataDir is the host folder mounted at /data.
	DataDir string
}

// Stream names an output stream.
type Stream int

const (
	Stdout Stream = iota + 1
	Stderr
)

// Output receives a program's output as it is produced, from one goroutine
// at a time.
type Output func(s Stream, p []byte)

// Outcome is how a program ended.
type Outcome struct {
	ExitCode  int // -1 when a signal ended it
	TimedOut  bool
	OOMKilled bool
	// Cancelled is set when ctx ended the run; context.Cause(ctx) says why.
	Cancelled bool
	Duration  time.Duration
}

// ErrUnknownLanguage reports a language no runner image offers.
var ErrUnknownLanguage = errors.New("sandbox: no runner for language")

// Run runs req in a new sandbox and removes the sandbox afterwards, however
// the run ends. Cancelling ctx kills the program. An error means the
// service failed, not the program.
func (m *Manager) Run(ctx context.Context, req Request, out Output) (Outcome, error) {
	m.mu.Lock()
	runner, ok := m.runners[req.Language]
	m.mu.Unlock()
	if !ok {
		return Outcome{}, fmt.Errorf("%w %q", ErrUnknownLanguage, req.Language)
	}
	sb, err := m.create(ctx, runner, req)
	if err != nil {
		return Outcome{}, err
	}
	defer m.remove(sb.id)
	return sb.run(ctx, req, out)
}

// sandbox is one started container and the agent in it.
type sandbox struct {
	m        *Manager
	id       string
	attach   client.HijackedResponse
	conn     *agent.Conn
	agentErr *logWriter
}

func (m *Manager) containerConfig(runner runbox.Runner, req Request) client.ContainerCreateOptions {
	limits := m.opts.Limits
	pids := limits.Pids
	init := true
	return client.ContainerCreateOptions{
		Name: "runbox-" + req.RunID,
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
				LabelRun:          req.RunID,
				LabelConversation: req.ConversationID,
			},
		},
		HostConfig: &container.HostConfig{
			NetworkMode:    "none",
			CapDrop:        []string{"ALL"},
			SecurityOpt:    []string{"no-new-privileges:true"},
			ReadonlyRootfs: true,
			Tmpfs:          map[string]string{"/tmp": "rw,nosuid,nodev,noexec,size=" + tmpfsSize},
			IpcMode:        "private",
			Init:           &init,
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
}

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
	opts := m.containerConfig(runner, req)
	created, err := m.docker.ContainerCreate(ctx, opts)
	if errdefs.IsConflict(err) {
		// A container of this run survived an earlier attempt: it is ours
		// to remove, and the name is ours to reuse.
		m.forceRemove(opts.Name)
		created, err = m.docker.ContainerCreate(ctx, opts)
	}
	if err != nil {
		return nil, fmt.Errorf("create container: %w", err)
	}
	m.track(created.ID)
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
	agentErr := &logWriter{log: m.log.With("container", shortID(created.ID))}
	go func() {
		_, err := stdcopy.StdCopy(pw, agentErr, att.Reader)
		pw.CloseWithError(err)
	}()
	sb := &sandbox{m: m, id: created.ID, attach: att.HijackedResponse, conn: agent.NewConn(pr, att.Conn), agentErr: agentErr}

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
	return sb, nil
}

// run sends req to the agent and relays its output until the program ends.
func (sb *sandbox) run(ctx context.Context, req Request, out Output) (Outcome, error) {
	defer sb.attach.Close()
	start := time.Now()
	if err := sb.conn.Start(agent.Run{Code: req.Code, Env: req.Env}); err != nil {
		return Outcome{}, fmt.Errorf("send program: %w", err)
	}
	go sb.feedStdin(req.Stdin)

	// Killing the container is the one sure way to stop everything in it;
	// the receive loop then ends on EOF.
	var (
		mu       sync.Mutex
		timedOut bool
		killed   bool
	)
	kill := func(timeout bool) {
		mu.Lock()
		if killed {
			mu.Unlock()
			return
		}
		killed, timedOut = true, timeout
		mu.Unlock()
		sb.m.kill(sb.id)
	}
	timer := time.AfterFunc(req.Timeout, func() { kill(true) })
	defer timer.Stop()
	stop := context.AfterFunc(ctx, func() { kill(false) })
	defer stop()

	var (
		exit    *agent.Exit
		recvErr error
	)
	for exit == nil && recvErr == nil {
		msg, err := sb.conn.Recv()
		switch {
		case err != nil:
			recvErr = err
		case msg.Kind == agent.Stdout:
			out(Stdout, msg.Data)
		case msg.Kind == agent.Stderr:
			out(Stderr, msg.Data)
		case msg.Kind == agent.Exited:
			exit = &msg.Exit
		case msg.Kind == agent.Failed:
			recvErr = fmt.Errorf("agent could not start the program: %s", msg.Err)
		}
	}
	timer.Stop()
	oc := Outcome{Duration: time.Since(start)}
	mu.Lock()
	oc.TimedOut, oc.Cancelled = timedOut, killed && !timedOut
	mu.Unlock()
	switch {
	case oc.TimedOut || oc.Cancelled:
		oc.ExitCode = -1
		return oc, nil
	case exit != nil:
		oc.ExitCode, oc.OOMKilled = exit.ExitCode, exit.OOMKilled
		return oc, nil
	}
	// The agent went away mid-run: the container died, most likely of the
	// memory limit.
	ictx, cancel := context.WithTimeout(context.WithoutCancel(ctx), removeTimeout)
	defer cancel()
	info, err := sb.m.docker.ContainerInspect(ictx, sb.id, client.ContainerInspectOptions{})
	if err == nil && info.Container.State != nil && !info.Container.State.Running {
		oc.ExitCode = -1
		oc.OOMKilled = info.Container.State.OOMKilled
		if oc.OOMKilled {
			return oc, nil
		}
	}
	return oc, fmt.Errorf("sandbox ended unexpectedly: %w (agent: %s)", recvErr, sb.agentErr.String())
}

// feedStdin copies the program's input to the agent, then closes it.
func (sb *sandbox) feedStdin(r io.Reader) {
	if r != nil {
		buf := make([]byte, 32<<10)
		for {
			n, err := r.Read(buf)
			if n > 0 {
				if sb.conn.Stdin(buf[:n]) != nil {
					return
				}
			}
			if err != nil {
				break
			}
		}
	}
	_ = sb.conn.CloseStdin()
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

// Reap removes this executor's containers that it does not track and that
// are older than minAge: orphans of an earlier process, or of a failure to
// remove. It returns how many it removed.
func (m *Manager) Reap(ctx context.Context, minAge time.Duration) (int, error) {
	res, err := m.docker.ContainerList(ctx, client.ContainerListOptions{
		All:     true,
		Filters: client.Filters{}.Add("label", LabelExecutor+"="+m.opts.ExecutorID),
	})
	if err != nil {
		return 0, fmt.Errorf("list containers: %w", err)
	}
	n := 0
	for _, c := range res.Items {
		m.mu.Lock()
		_, tracked := m.live[c.ID]
		m.mu.Unlock()
		if tracked || time.Since(time.Unix(c.Created, 0)) < minAge {
			continue
		}
		m.forceRemove(c.ID)
		n++
	}
	return n, nil
}

// Live returns how many containers the manager has started and not yet
// removed.
func (m *Manager) Live() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.live)
}

func shortID(id string) string {
	if len(id) > 12 {
		return id[:12]
	}
	return id
}

// logWriter logs what the agent writes to stderr and keeps the last of it
// for error messages.
type logWriter struct {
	log  *slog.Logger
	mu   sync.Mutex
	tail []byte
}

func (w *logWriter) Write(p []byte) (int, error) {
	w.log.Warn("sandbox agent", "stderr", string(p))
	w.mu.Lock()
	w.tail = append(w.tail, p...)
	if len(w.tail) > 512 {
		w.tail = w.tail[len(w.tail)-512:]
	}
	w.mu.Unlock()
	return len(p), nil
}

func (w *logWriter) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return string(w.tail)
}
