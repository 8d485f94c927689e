package docker

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/containerd/errdefs"
	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/client"

	"github.com/runbox-dev/runbox/internal/sandbox/engine"
)

// Runtime is what differs between the OCI runtimes sandboxes run under:
// the engine's default (runc: the host's kernel, namespaces and cgroups)
// and gVisor's runsc (a user-space kernel between programs and the host).
// It is chosen once, at start, from SANDBOX_RUNTIME.
type Runtime struct {
	// Name is the runtime Docker is asked for; "" is the engine's default.
	Name string
	// AgentApart runs the agent as root, with only the capabilities it
	// needs to start programs as the Spec's User and to end and clean up
	// after them, instead of as that user itself: for a kernel that leaves a non-dumpable
	// process's descriptors to its user (agent.Config.User).
	AgentApart bool
	// PidsInside holds the sandbox's process limit inside its kernel, as
	// RLIMIT_NPROC of the programs' user, and gives the host's pids limit
	// room for the runtime's own threads and processes: gVisor's sentry
	// with the ptrace platform takes host tasks by the dozen per sandbox
	// process (measured here: 1561 for 20 shell loops, 38 idle), and at the
	// host's limit the sentry itself fails, and the sandbox with it.
	PidsInside bool
	// NoLandlock says that its kernel has no Landlock, which filesystem
	// rules need (gVisor implements none); the host's is probed.
	NoLandlock bool
}

// Host tasks PidsInside allows: per sandbox process, and for the runtime.
const (
	runtimePidsEach = 32
	runtimePids     = 256
)

// agentCaps are the capabilities of an agent apart from programs: start
// them as the Spec's User (SETUID, SETGID), kill them (KILL), read their limits
// (SYS_RESOURCE) and the template's I/O priority (SYS_NICE: gVisor asks
// for it where Linux lets anyone read one), empty what they leave in /tmp
// and /dev/shm (FOWNER, DAC_OVERRIDE) and give them their caches (CHOWN).
// Programs have none: they lose them with their user's change and their
// exec.
var agentCaps = []string{"SETUID", "SETGID", "KILL", "SYS_RESOURCE", "SYS_NICE", "FOWNER", "DAC_OVERRIDE", "CHOWN"}

// RuntimeFor returns the Runtime of an OCI runtime's name.
func RuntimeFor(name string) Runtime {
	switch name {
	case "runsc":
		// gVisor shows a non-dumpable process's /proc/<pid>/fd to
		// processes of its user (its release of 2022-12 let them open the
		// descriptors there), so the agent runs as another user than
		// programs (see SECURITY.md). The
		// agent itself finds what else differs (agent.DenyMqueuesUnlisted,
		// the I/O priority in attrs.go) and proves each reset as under
		// runc.
		return Runtime{Name: name, AgentApart: true, PidsInside: true, NoLandlock: true}
	default:
		return Runtime{Name: name}
	}
}

// configure applies the runtime's container options to a container whose
// programs run as user.
func (r Runtime) configure(cfg *container.Config, hc *container.HostConfig, user string) {
	hc.Runtime = r.Name
	if r.PidsInside && hc.PidsLimit != nil {
		pids := *hc.PidsLimit
		hc.Ulimits = append(hc.Ulimits, &container.Ulimit{Name: "nproc", Soft: pids, Hard: pids})
		host := runtimePidsEach*pids + runtimePids
		hc.PidsLimit = &host
	}
	if r.AgentApart {
		cfg.User = "0:0"
		cfg.Env = append(cfg.Env, "RUNBOX_USER="+user)
		hc.CapAdd = agentCaps
	}
}

// String names the runtime for messages.
func (r Runtime) String() string {
	if r.Name == "" {
		return "the engine's default runtime"
	}
	return "runtime " + r.Name
}

// runtimeCheckTimeout bounds the start check's container.
const runtimeCheckTimeout = 60 * time.Second

// Check checks that the Docker Engine knows the configured runtime and
// that a container of spec's image, user and labels starts and exits under
// it. An executor calls it at start, so that a runtime that is missing or
// broken stops it with one clear line rather than failing every run.
func (e *Engine) Check(ctx context.Context, spec engine.Spec) error {
	rt := e.opts.Runtime
	if rt.Name == "" {
		return nil
	}
	info, err := e.c.Info(ctx, client.InfoOptions{})
	if err != nil {
		return fmt.Errorf("read the Docker Engine's runtimes: %w", err)
	}
	if _, ok := info.Info.Runtimes[rt.Name]; !ok {
		return fmt.Errorf("the Docker Engine has no runtime %q (SANDBOX_RUNTIME): register it in /etc/docker/daemon.json (for runsc: deploy/runsc.sh, or make deps SANDBOX_RUNTIME=runsc)", rt.Name)
	}
	cctx, cancel := context.WithTimeout(ctx, runtimeCheckTimeout)
	defer cancel()
	created, err := e.c.ContainerCreate(cctx, client.ContainerCreateOptions{
		Config: &container.Config{
			Image: spec.Image, User: spec.User, Cmd: []string{"true"}, NetworkDisabled: true, Labels: spec.Labels,
		},
		HostConfig: &container.HostConfig{
			Runtime: rt.Name, NetworkMode: "none", CapDrop: []string{"ALL"},
			LogConfig: container.LogConfig{Type: "none"},
		},
	})
	if err != nil {
		return fmt.Errorf("%s: create a container: %w", rt, err)
	}
	defer e.removeAfter(created.ID)
	wait := e.c.ContainerWait(cctx, created.ID, client.ContainerWaitOptions{Condition: container.WaitConditionNextExit})
	if _, err := e.c.ContainerStart(cctx, created.ID, client.ContainerStartOptions{}); err != nil {
		return fmt.Errorf("%s: start a container: %w", rt, err)
	}
	select {
	case res := <-wait.Result:
		if res.StatusCode != 0 || res.Error != nil {
			return fmt.Errorf("%s: a container that runs `true` exited with %d", rt, res.StatusCode)
		}
		return nil
	case err := <-wait.Error:
		if errdefs.IsNotFound(err) {
			err = errors.New("it was removed")
		}
		return fmt.Errorf("%s: wait for a container: %w", rt, err)
	}
}
