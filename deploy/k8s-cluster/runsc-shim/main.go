// Command containerd-shim-runsc-v1 is gVisor's containerd shim — its task
// service, gvisor.dev/gvisor/pkg/shim/v1, which runs a pod's containers
// with runsc — started the way containerd's own runc shim is started.
//
// gVisor's own start-up sets the shim's oom_score_adj to -999, which
// needs CAP_SYS_RESOURCE; machines whose bounding set lacks it (this
// project's CI machines among them) cannot start a single gVisor pod. The
// runc shim instead sets its score one above containerd's, which needs no
// capability: the shim is then killed before containerd, never before the
// sandbox it serves (whose score the kubelet sets higher still). Stopping
// a shim and describing the runtime are gVisor's own.
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"syscall"

	"github.com/containerd/containerd/v2/pkg/namespaces"
	"github.com/containerd/containerd/v2/pkg/shim"
	gvisor "gvisor.dev/gvisor/pkg/shim/v1"
	// Registers gVisor's task service, which the shim's daemon serves.
	_ "gvisor.dev/gvisor/pkg/shim/v1/plugin"
	"gvisor.dev/gvisor/pkg/shim/v1/runsc"
)

// sandboxAnnotation names, on every container of a pod, the pod's sandbox:
// with grouping on, a pod's containers share one shim.
const sandboxAnnotation = "io.kubernetes.cri.sandbox-id"

type manager struct {
	shim.Manager // gVisor's, for Name, Stop and Info
}

func main() {
	shim.Run(context.Background(), manager{gvisor.NewShimManager("io.containerd.runsc.v1")})
}

// Start starts the shim's daemon for the container id (or joins the one
// its pod has) and returns its address. It runs in the container's bundle.
func (m manager) Start(ctx context.Context, id string, opts shim.StartOpts) (shim.BootstrapParams, error) {
	group, err := grouping(id)
	if err != nil {
		return shim.BootstrapParams{}, err
	}
	address, err := shim.SocketAddress(ctx, opts.Address, group, opts.Debug)
	if err != nil {
		return shim.BootstrapParams{}, err
	}
	params := shim.BootstrapParams{Version: 2, Address: address, Protocol: "ttrpc"}
	socket, err := shim.NewSocket(address)
	if err != nil {
		if !shim.SocketEaddrinuse(err) {
			return shim.BootstrapParams{}, fmt.Errorf("create the shim's socket: %w", err)
		}
		// The pod's shim serves this container too.
		if shim.CanConnect(address) {
			return params, writeAddress(address)
		}
		// A shim that is gone left its socket.
		if err := shim.RemoveSocket(address); err != nil {
			return shim.BootstrapParams{}, fmt.Errorf("remove a stale shim socket: %w", err)
		}
		if socket, err = shim.NewSocket(address); err != nil {
			return shim.BootstrapParams{}, fmt.Errorf("create the shim's socket: %w", err)
		}
	}
	started := false
	defer func() {
		if !started {
			socket.Close()
			_ = shim.RemoveSocket(address)
		}
	}()
	if err := writeAddress(address); err != nil {
		return shim.BootstrapParams{}, err
	}
	cmd, err := daemon(ctx, id, opts)
	if err != nil {
		return shim.BootstrapParams{}, err
	}
	f, err := socket.File()
	if err != nil {
		return shim.BootstrapParams{}, err
	}
	defer f.Close()
	cmd.ExtraFiles = []*os.File{f}
	if err := cmd.Start(); err != nil {
		return shim.BootstrapParams{}, err
	}
	// Reaped if it ends before this process does; it normally outlives it.
	go func() { _ = cmd.Wait() }()
	if err := shim.WritePidFile("shim.pid", cmd.Process.Pid); err != nil {
		_ = cmd.Process.Kill()
		return shim.BootstrapParams{}, err
	}
	if err := shim.AdjustOOMScore(cmd.Process.Pid); err != nil {
		_ = cmd.Process.Kill()
		return shim.BootstrapParams{}, err
	}
	started = true
	return params, nil
}

// daemon is the command that serves the shim: this binary again, which
// containerd's shim library runs as the daemon when it is not given an
// action.
func daemon(ctx context.Context, id string, opts shim.StartOpts) (*exec.Cmd, error) {
	ns, err := namespaces.NamespaceRequired(ctx)
	if err != nil {
		return nil, err
	}
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	bundle, err := os.Getwd()
	if err != nil {
		return nil, err
	}
	args := []string{"-namespace", ns, "-address", opts.Address, "-id", id}
	if opts.Debug {
		args = append(args, "-debug")
	}
	cmd := exec.Command(self, args...)
	cmd.Dir = bundle
	cmd.Env = append(os.Environ(), "GOMAXPROCS=2")
	// Its own process group: a signal to containerd's group does not
	// reach the shims.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	return cmd, nil
}

// grouping is the key of the shim that serves container id: its pod's
// sandbox when the runtime's options ask for one shim a pod (gVisor's
// "grouping"), else the container itself.
func grouping(id string) (string, error) {
	if opts := runsc.GetRuntimeOptions(); opts == nil || !opts.Grouping {
		return id, nil
	}
	b, err := os.ReadFile("config.json")
	if err != nil {
		return "", fmt.Errorf("read the container's spec: %w", err)
	}
	var spec struct {
		Annotations map[string]string `json:"annotations"`
	}
	if err := json.Unmarshal(b, &spec); err != nil {
		return "", fmt.Errorf("read the container's spec: %w", err)
	}
	if sandbox := spec.Annotations[sandboxAnnotation]; sandbox != "" {
		return sandbox, nil
	}
	return id, nil
}

// writeAddress records the shim's address in the bundle, where gVisor's
// task service and containerd read it.
func writeAddress(address string) error {
	if err := os.WriteFile("address", []byte(address), 0o644); err != nil {
		return fmt.Errorf("record the shim's address: %w", err)
	}
	return nil
}
