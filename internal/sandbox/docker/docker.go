// Package docker runs sandboxes (package sandbox) as containers of a
// Docker Engine: the engine of an executor whose sandboxes run on its own
// host. It is the one package that speaks the Docker Engine API.
package docker

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/containerd/errdefs"
	"github.com/moby/moby/api/pkg/stdcopy"
	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/api/types/mount"
	"github.com/moby/moby/client"

	"github.com/runbox-dev/runbox/internal/agent"
	"github.com/runbox-dev/runbox/internal/sandbox/engine"
)

// Options configure an Engine.
type Options struct {
	// Runtime is the OCI runtime of sandboxes and what differs under it
	// (RuntimeFor); the zero value is the engine's default.
	Runtime Runtime
}

// Engine runs sandboxes as containers. Its methods are safe for
// concurrent use.
type Engine struct {
	c    *client.Client
	opts Options
}

// New returns an Engine using c.
func New(c *client.Client, opts Options) *Engine {
	return &Engine{c: c, opts: opts}
}

// pingTimeout bounds Open's wait for the engine's answer.
const pingTimeout = 5 * time.Second

// Open connects to the Docker Engine the environment names (DOCKER_HOST
// and the rest, or the local socket) and checks that it answers.
func Open(ctx context.Context, opts Options) (*Engine, error) {
	c, err := client.New(client.FromEnv)
	if err != nil {
		return nil, fmt.Errorf("docker: %w", err)
	}
	pctx, cancel := context.WithTimeout(ctx, pingTimeout)
	defer cancel()
	if _, err := c.Ping(pctx, client.PingOptions{NegotiateAPIVersion: true}); err != nil {
		c.Close()
		return nil, fmt.Errorf("the Docker Engine is not reachable (is it running, and may this user use it?): %w", err)
	}
	return New(c, opts), nil
}

// Close closes the connection to the Docker Engine.
func (e *Engine) Close() error { return e.c.Close() }

// Ping checks that the Docker Engine answers.
func (e *Engine) Ping(ctx context.Context) error {
	_, err := e.c.Ping(ctx, client.PingOptions{})
	return err
}

// Images returns the images that carry label (key=value).
func (e *Engine) Images(ctx context.Context, label string) ([]engine.Image, error) {
	res, err := e.c.ImageList(ctx, client.ImageListOptions{Filters: client.Filters{}.Add("label", label)})
	if err != nil {
		return nil, err
	}
	out := make([]engine.Image, 0, len(res.Items))
	for _, img := range res.Items {
		out = append(out, engine.Image{Tags: references(img.RepoTags), Labels: img.Labels})
	}
	return out, nil
}

// references drops from an image's tags the placeholder a Docker Engine
// of API 1.43 and older lists for an untagged image, "<none>:<none>": a
// runner image's previous build, or the layer a build has made so far,
// carries the runner labels without a name a container can be created
// from ("invalid reference format", at every try of the pool).
func references(tags []string) []string {
	out := make([]string, 0, len(tags))
	for _, t := range tags {
		if t != "<none>:<none>" {
			out = append(out, t)
		}
	}
	return out
}

// createTimeout bounds a container's creation, which is not cancelled
// midway: the daemon would go on to create a container whose id we would
// never learn.
const createTimeout = 30 * time.Second

// Create makes, attaches to and starts a container of spec; its standard
// error goes to stderr. Any failure removes the container.
func (e *Engine) Create(ctx context.Context, spec engine.Spec, stderr io.Writer) (_ engine.Attached, err error) {
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), createTimeout)
	created, err := e.c.ContainerCreate(cctx, e.createOptions(spec))
	cancel()
	if err != nil {
		return engine.Attached{}, fmt.Errorf("create container: %w", err)
	}
	defer func() {
		if err != nil {
			e.removeAfter(created.ID)
		}
	}()
	if err := ctx.Err(); err != nil {
		return engine.Attached{}, err
	}
	// Attach before start, or early output is lost.
	att, err := e.c.ContainerAttach(ctx, created.ID, client.ContainerAttachOptions{
		Stream: true, Stdin: true, Stdout: true, Stderr: true,
	})
	if err != nil {
		return engine.Attached{}, fmt.Errorf("attach container: %w", err)
	}
	if _, err := e.c.ContainerStart(ctx, created.ID, client.ContainerStartOptions{}); err != nil {
		att.Close()
		return engine.Attached{}, fmt.Errorf("start container: %w", err)
	}
	// The attach stream multiplexes stdout and stderr.
	pr, pw := io.Pipe()
	done := make(chan struct{})
	go func() {
		_, err := stdcopy.StdCopy(pw, stderr, att.Reader)
		// The container stopped, or the engine went away (restarted).
		close(done)
		pw.CloseWithError(err)
	}()
	return engine.Attached{ID: created.ID, Stdin: att.Conn, Stdout: pr, Done: done, Closer: closer(att.Close)}, nil
}

// closer makes a func an io.Closer.
type closer func()

func (c closer) Close() error {
	c()
	return nil
}

// removeAfter removes a container whose creation failed midway.
func (e *Engine) removeAfter(id string) {
	ctx, cancel := context.WithTimeout(context.Background(), createTimeout)
	defer cancel()
	_ = e.Remove(ctx, id)
}

// createOptions turns spec into the container's, locked down as
// engine.Spec says, under the runtime.
func (e *Engine) createOptions(spec engine.Spec) client.ContainerCreateOptions {
	pids := spec.Limits.Pids
	mounts := make([]mount.Mount, 0, len(spec.Mounts))
	for _, m := range spec.Mounts {
		mounts = append(mounts, mount.Mount{Type: mount.TypeBind, Source: m.Source, Target: m.Target, ReadOnly: m.ReadOnly})
	}
	opts := client.ContainerCreateOptions{
		Name: spec.Name,
		Config: &container.Config{
			Image:           spec.Image,
			User:            spec.User,
			WorkingDir:      spec.WorkDir,
			AttachStdin:     true,
			AttachStdout:    true,
			AttachStderr:    true,
			OpenStdin:       true,
			StdinOnce:       true,
			NetworkDisabled: true,
			Labels:          spec.Labels,
		},
		HostConfig: &container.HostConfig{
			NetworkMode:    "none",
			CapDrop:        []string{"ALL"},
			SecurityOpt:    []string{"no-new-privileges:true"},
			ReadonlyRootfs: true,
			Tmpfs:          tmpfs(spec),
			IpcMode:        "private",
			// The agent is PID 1 and reaps orphans itself: docker-init
			// would run as the programs' user, within their reach.
			Init: &noInit,
			// What a program prints reaches the executor through the
			// agent's frames; nothing of it is kept on the host's disk.
			LogConfig: container.LogConfig{Type: "none"},
			Mounts:    mounts,
			Resources: container.Resources{
				Memory:     spec.Limits.Memory,
				MemorySwap: spec.Limits.Memory,
				NanoCPUs:   spec.Limits.NanoCPUs,
				PidsLimit:  &pids,
				Ulimits:    ulimits(spec.Limits),
			},
		},
	}
	e.opts.Runtime.configure(opts.Config, opts.HostConfig, spec.User)
	return opts
}

var noInit = false

// tmpfs returns the tmpfs mounts of spec as Docker takes them.
func tmpfs(spec engine.Spec) map[string]string {
	out := make(map[string]string, len(spec.Tmpfs))
	for _, t := range spec.Tmpfs {
		o := "rw,nosuid,nodev,noexec,size=" + t.Size
		if t.Exec {
			o = "rw,nosuid,nodev,exec,size=" + t.Size
		}
		if t.Private {
			uid, gid, _ := strings.Cut(spec.User, ":")
			o += ",uid=" + uid + ",gid=" + gid + ",mode=0700"
		}
		out[t.Target] = o
	}
	return out
}

func ulimits(l engine.Limits) []*container.Ulimit {
	u := []*container.Ulimit{
		{Name: "nofile", Soft: l.OpenFiles, Hard: l.OpenFiles},
		{Name: "core", Soft: 0, Hard: 0},
	}
	if fs := l.FileSize; fs > 0 {
		u = append(u, &container.Ulimit{Name: "fsize", Soft: fs, Hard: fs})
	}
	return u
}

// Kill stops a container now; one already stopped or gone is no error.
func (e *Engine) Kill(ctx context.Context, id string) error {
	_, err := e.c.ContainerKill(ctx, id, client.ContainerKillOptions{Signal: "KILL"})
	if err != nil && !errdefs.IsNotFound(err) && !errdefs.IsConflict(err) {
		return err
	}
	return nil
}

// removeAttempts bounds the tries of Remove.
const removeAttempts = 5

// Remove deletes a container whatever its state, with its anonymous
// volumes; one gone already is no error.
func (e *Engine) Remove(ctx context.Context, id string) error {
	for attempt := 0; ; attempt++ {
		_, err := e.c.ContainerRemove(ctx, id, client.ContainerRemoveOptions{Force: true, RemoveVolumes: true})
		if err == nil || errdefs.IsNotFound(err) {
			return nil
		}
		// "removal already in progress" and similar pass quickly.
		if attempt == removeAttempts-1 || ctx.Err() != nil {
			return err
		}
		time.Sleep(time.Duration(100<<attempt) * time.Millisecond)
	}
}

// List returns the containers, running or not, that carry every label.
func (e *Engine) List(ctx context.Context, labels map[string]string) ([]engine.Sandbox, error) {
	f := client.Filters{}
	for k, v := range labels {
		f = f.Add("label", k+"="+v)
	}
	res, err := e.c.ContainerList(ctx, client.ContainerListOptions{All: true, Filters: f})
	if err != nil {
		return nil, fmt.Errorf("list containers: %w", err)
	}
	out := make([]engine.Sandbox, 0, len(res.Items))
	for _, c := range res.Items {
		out = append(out, engine.Sandbox{ID: c.ID, Labels: c.Labels, Created: time.Unix(c.Created, 0)})
	}
	return out, nil
}

// Wait waits until a container is not running, or ctx ends.
func (e *Engine) Wait(ctx context.Context, id string) error {
	wait := e.c.ContainerWait(ctx, id, client.ContainerWaitOptions{Condition: container.WaitConditionNotRunning})
	select {
	case <-wait.Result:
		return nil
	case err := <-wait.Error:
		return err
	}
}

// Inspect returns the state of a container's first process.
func (e *Engine) Inspect(ctx context.Context, id string) (engine.State, error) {
	info, err := e.c.ContainerInspect(ctx, id, client.ContainerInspectOptions{})
	if err != nil {
		return engine.State{}, err
	}
	s := info.Container.State
	if s == nil {
		return engine.State{}, errors.New("the engine says nothing of the container's state")
	}
	return engine.State{Running: s.Running, ExitCode: s.ExitCode, OOMKilled: s.OOMKilled}, nil
}

// Capabilities: containers of the executor's host, which mount its
// folders and take its memory.
func (e *Engine) Capabilities() engine.Capabilities {
	return engine.Capabilities{HostFolders: true, HostMemory: true}
}

// Landlock reports whether programs in these sandboxes can be held to
// filesystem rules (agent.Rules): the runtime's kernel offers Landlock.
func (e *Engine) Landlock() bool {
	return !e.opts.Runtime.NoLandlock && agent.LandlockABI() >= agent.MinLandlockABI
}
