package kubernetes

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/url"
	"os"
	"strconv"
	"strings"

	"github.com/docker/go-units"
	"k8s.io/klog/v2"

	"github.com/runbox-dev/runbox/internal/agent"
	"github.com/runbox-dev/runbox/internal/sandbox/engine"
)

// Sandboxes is the engine as the sandbox manager uses it (its Engine
// interface, package sandbox): engine.Spec in, pods out.
type Sandboxes struct {
	*Engine
	// ImageList lists the runner images that carry a label: a cluster has
	// no API that lists the images its nodes hold with their labels, so
	// they come from elsewhere (the executor's configuration).
	ImageList func(ctx context.Context, label string) ([]engine.Image, error)
	// Quota bounds a sandbox's /data: its emptyDir's size (Bytes), its
	// agent's measure as each run goes (agent.Config.Quota, which stops
	// a program past it), and what is copied out of it. Zero values are
	// no bound.
	Quota agent.Quota
}

// Settings of the agent (cmd/runbox-agent) for the bounds Docker sets
// otherwise: a container's ulimit (RLIMIT_FSIZE, engine.Limits.FileSize)
// and the executor's measure of the folder it shares (walk mode).
const (
	FileSizeEnv   = "RUNBOX_FILE_SIZE"
	QuotaBytesEnv = "RUNBOX_QUOTA_BYTES"
	QuotaFilesEnv = "RUNBOX_QUOTA_FILES"
)

// Create starts a pod of spec and attaches to its agent. A mount at
// /data (the executor's folder of the conversation) becomes the pod's
// emptyDir, with the folder copied in before each run that follows a
// change of it and copied out after each run (filesync.go); any other
// mount is refused: a pod gets no host path.
func (s *Sandboxes) Create(ctx context.Context, spec engine.Spec, stderr io.Writer) (engine.Attached, error) {
	ps, dir, err := s.podSpec(spec)
	if err != nil {
		return engine.Attached{}, err
	}
	var held *heldFolder
	if dir != "" {
		if held, err = holdFolder(dir); err != nil {
			return engine.Attached{}, err
		}
	}
	st, err := s.Start(ctx, ps, stderr)
	if err != nil {
		if held != nil {
			held.Close()
		}
		return engine.Attached{}, err
	}
	if held == nil {
		return engine.Attached{ID: ps.Name, Stdin: st, Stdout: st, Done: st.Done(), Closer: st}, nil
	}
	fc := &folderCopier{e: s.Engine, pod: ps.Name, dir: held, quota: s.Quota}
	fc.startEmpty(dir)
	rw := syncFiles(st, fc)
	return engine.Attached{ID: ps.Name, Stdin: rw, Stdout: rw, Done: st.Done(), Closer: closers{rw, st, held}}, nil
}

// closers closes each in turn.
type closers []io.Closer

func (cs closers) Close() error {
	for _, c := range cs {
		c.Close()
	}
	return nil
}

// podSpec is the pod of spec, and the folder to carry to its /data.
func (s *Sandboxes) podSpec(spec engine.Spec) (Spec, string, error) {
	ps := Spec{
		Name: podName(spec.Name), Image: spec.Image, Labels: spec.Labels,
		Memory: spec.Limits.Memory, MilliCPU: spec.Limits.NanoCPUs / 1e6,
		DataSize: s.Quota.Bytes, Tmpfs: map[string]int64{}, Env: s.limitsEnv(spec.Limits),
	}
	for _, t := range spec.Tmpfs {
		size, err := units.RAMInBytes(t.Size)
		if err != nil {
			return Spec{}, "", fmt.Errorf("kubernetes: tmpfs %s: %w", t.Target, err)
		}
		ps.Tmpfs[t.Target] = size
	}
	dir := ""
	for _, m := range spec.Mounts {
		if m.Target != DataDir {
			return Spec{}, "", fmt.Errorf("kubernetes: a sandbox pod mounts nothing of a host (asked for %s)", m.Target)
		}
		dir = m.Source
	}
	if s.settings.RuntimeClass == "runsc" {
		// gVisor: the agent apart from programs, as package docker's
		// Runtime does it.
		ps.Root, ps.Caps = true, agentCaps
		ps.Env["RUNBOX_USER"] = spec.User
	}
	return ps, dir, nil
}

// limitsEnv are the agent's settings of the bounds a pod cannot set
// itself: no pod sets a ulimit, and no executor measures its /data.
func (s *Sandboxes) limitsEnv(l engine.Limits) map[string]string {
	env := map[string]string{}
	for name, v := range map[string]int64{FileSizeEnv: l.FileSize, QuotaBytesEnv: s.Quota.Bytes, QuotaFilesEnv: int64(s.Quota.Entries)} {
		if v > 0 {
			env[name] = strconv.FormatInt(v, 10)
		}
	}
	return env
}

// agentCaps are those of an agent apart from programs (package docker's
// Runtime).
var agentCaps = []string{"SETUID", "SETGID", "KILL", "SYS_RESOURCE", "SYS_NICE", "FOWNER", "DAC_OVERRIDE", "CHOWN"}

// podName makes a manager's sandbox name a pod's: lower case, at most 63
// characters, unique.
func podName(name string) string {
	n := strings.Trim(nameUnsafe.ReplaceAllString(strings.ToLower(name), "-"), "-")
	if len(n) > 40 {
		n = n[:40]
	}
	return PodName(strings.TrimPrefix(n, "runbox-"))
}

// Images returns the runner images that carry label (ImageList's).
func (s *Sandboxes) Images(ctx context.Context, label string) ([]engine.Image, error) {
	if s.ImageList == nil {
		return nil, nil
	}
	return s.ImageList(ctx, label)
}

// Check starts a pod of spec and removes it: that a sandbox's pod is
// admitted and runs, with its image, under the runtime class.
func (s *Sandboxes) Check(ctx context.Context, spec engine.Spec) error {
	ps, _, err := s.podSpec(spec)
	if err != nil {
		return err
	}
	if err := s.Engine.Create(ctx, ps); err != nil {
		return err
	}
	return s.Engine.Remove(ps.Name)
}

func (s *Sandboxes) Kill(ctx context.Context, id string) error   { return s.Engine.Kill(id) }
func (s *Sandboxes) Remove(ctx context.Context, id string) error { return s.Engine.Remove(id) }

// List returns the sandbox pods that carry every label.
func (s *Sandboxes) List(ctx context.Context, labels map[string]string) ([]engine.Sandbox, error) {
	found, err := s.Engine.List(ctx, labels)
	if err != nil {
		return nil, err
	}
	out := make([]engine.Sandbox, 0, len(found))
	for _, sb := range found {
		out = append(out, engine.Sandbox{ID: sb.Name, Labels: sb.Labels, Created: sb.Created})
	}
	return out, nil
}

// Wait waits until a sandbox's container is not running.
func (s *Sandboxes) Wait(ctx context.Context, id string) error {
	_, err := s.WaitExited(ctx, id)
	if err == ErrGone {
		return nil
	}
	return err
}

// Inspect returns how a sandbox's container ended.
func (s *Sandboxes) Inspect(ctx context.Context, id string) (engine.State, error) {
	st, err := s.Engine.Inspect(ctx, id)
	if err != nil {
		return engine.State{}, err
	}
	return engine.State{Running: st.Running, ExitCode: st.ExitCode, OOMKilled: st.OOMKilled}, nil
}

// Landlock: a node's kernel is not known here; gVisor has none.
func (s *Sandboxes) Landlock() bool { return s.settings.RuntimeClass != "runsc" }

// Capabilities: none beyond every engine's. A pod mounts nothing of the
// executor's host (its files are carried in and out, egress comes over
// its agent's stream) and takes a node's memory, not the executor's.
func (s *Sandboxes) Capabilities() engine.Capabilities { return engine.Capabilities{} }

// Open connects to the cluster of kubeconfig (in-cluster if "") and
// returns the engine of sandbox pods in namespace under runtimeClass.
// Sandboxes wait for their isolation from the API server (the address
// the executor reaches it at); when the executor itself runs in the
// sandboxes' namespace (POD_NAMESPACE, POD_NAME and POD_UID from the
// downward API), its pod owns them.
func Open(ctx context.Context, kubeconfig, namespace, runtimeClass string) (*Sandboxes, error) {
	cfg, err := RESTConfig(kubeconfig)
	if err != nil {
		return nil, err
	}
	api, err := url.Parse(cfg.Host)
	if err != nil || api.Hostname() == "" {
		return nil, fmt.Errorf("kubernetes: the API server's address %q", cfg.Host)
	}
	port := api.Port()
	if port == "" {
		port = "443"
	}
	s := Settings{Namespace: namespace, RuntimeClass: runtimeClass, Isolated: net.JoinHostPort(api.Hostname(), port)}
	if os.Getenv("POD_NAMESPACE") == namespace && os.Getenv("POD_NAME") != "" && os.Getenv("POD_UID") != "" {
		s.Owner = &Owner{Name: os.Getenv("POD_NAME"), UID: os.Getenv("POD_UID")}
	}
	e, err := New(cfg, s)
	if err != nil {
		return nil, err
	}
	pctx, cancel := context.WithTimeout(ctx, apiTimeout)
	defer cancel()
	if err := e.Ping(pctx); err != nil {
		return nil, err
	}
	return &Sandboxes{Engine: e}, nil
}

// Close releases nothing: the engine's connections are client-go's.
func (s *Sandboxes) Close() error { return nil }

// RouteClientLogs sends what client-go logs (through klog: a watch that
// ended, a throttled request, a retried connection) to log, rather than
// to standard error in klog's own format beside the executor's JSON.
// klog's logger is the process's: call it once, at start.
func RouteClientLogs(log *slog.Logger) {
	klog.SetSlogLogger(log.With("component", "client-go"))
}
