package testenv

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Cluster is a real single-node Kubernetes (deploy/k8s-cluster) on this
// machine: its control plane, a kubelet with its own containerd, Services
// (kube-proxy), cluster DNS (CoreDNS), NetworkPolicy (kube-router) and the
// RuntimeClass "runsc" (gVisor). A test binary shares one: the first test
// that asks for it starts it, and KubernetesMain stops it when the tests
// are done, leaving nothing behind on the host.
type Cluster struct {
	// Kubeconfig is the path of a cluster administrator's kubeconfig.
	Kubeconfig string
	// API is the API server's URL: https://<node IP>:<port>.
	API string
	// Node is the node's name; NodeIP its address, where the API server,
	// the kubelet and cluster DNS listen.
	Node, NodeIP string
	// PodCIDR and ServiceCIDR are the ranges pods' and Services' addresses
	// come from; APIServiceIP and DNSServiceIP are the cluster IPs of the
	// Services kubernetes (default) and kube-dns (kube-system).
	PodCIDR, ServiceCIDR       string
	APIServiceIP, DNSServiceIP string

	dir     string
	kubectl string
	script  string // deploy/k8s-cluster

	importMu sync.Mutex
}

// The test binary's cluster.
var (
	clusterMain    bool
	clusterOnce    sync.Once
	clusterRunning *runningCluster
	clusterErr     error
)

// runningCluster is the cluster with the process (run.sh) that keeps it.
type runningCluster struct {
	*Cluster
	cmd   *exec.Cmd
	stdin io.WriteCloser
	log   string
}

// Kubernetes returns the test binary's cluster, starting it if this is
// the first test to ask. The package's TestMain must hand its tests to
// KubernetesMain, which stops the cluster at the end. A machine without
// the cluster's binaries fails the test with the command that builds
// them: integration tests do not skip.
func Kubernetes(t testing.TB) *Cluster {
	t.Helper()
	if !clusterMain {
		t.Fatal("testenv.Kubernetes: the package's TestMain must run its tests with testenv.KubernetesMain")
	}
	clusterOnce.Do(func() { clusterRunning, clusterErr = startCluster() })
	if clusterErr != nil {
		t.Fatal(clusterErr)
	}
	return clusterRunning.Cluster
}

// KubernetesMain runs the tests of a package whose tests use Kubernetes,
// then stops the cluster if one was started; it returns the exit code:
//
//	func TestMain(m *testing.M) { os.Exit(testenv.KubernetesMain(m)) }
//
// A cluster that leaves something behind on the host fails the run.
func KubernetesMain(m *testing.M) int {
	clusterMain = true
	code := m.Run()
	if clusterRunning != nil {
		if err := clusterRunning.stop(); err != nil {
			fmt.Fprintln(os.Stderr, err)
			if code == 0 {
				code = 1
			}
		}
	}
	return code
}

// startCluster starts deploy/k8s-cluster/run.sh and waits until it says
// the cluster is up. run.sh stops the cluster when its standard input
// closes: when stop closes it, and when this process dies whatever the
// reason.
func startCluster() (*runningCluster, error) {
	root, err := repoRoot()
	if err != nil {
		return nil, err
	}
	script := filepath.Join(root, "deploy", "k8s-cluster")
	dir, err := os.MkdirTemp("", "runbox-k8s-")
	if err != nil {
		return nil, err
	}
	logPath := dir + ".log"
	logFile, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	defer logFile.Close()
	cmd := exec.Command(filepath.Join(script, "run.sh"), dir)
	cmd.Env = append(os.Environ(), "K8S_KEEP_IMAGES=1")
	cmd.Stderr = logFile
	// Its own process group: a Ctrl-C meant for the tests reaches run.sh
	// only as the end of its input, after which it stops the cluster.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start the test cluster: %w", err)
	}
	line, _ := bufio.NewReader(stdout).ReadString('\n')
	if strings.TrimSpace(line) != "ready" {
		stdin.Close()
		_ = cmd.Wait()
		return nil, fmt.Errorf("the test cluster did not start:\n%s", tail(logPath, 40))
	}
	env, err := readEnv(filepath.Join(dir, "cluster.env"))
	if err != nil {
		stdin.Close()
		_ = cmd.Wait()
		return nil, err
	}
	c := &Cluster{
		Kubeconfig:   env["KUBECONFIG"],
		API:          env["K8S_API"],
		Node:         env["K8S_NODE"],
		NodeIP:       env["K8S_NODE_IP"],
		PodCIDR:      env["K8S_POD_CIDR"],
		ServiceCIDR:  env["K8S_SERVICE_CIDR"],
		APIServiceIP: env["K8S_API_SERVICE_IP"],
		DNSServiceIP: env["K8S_DNS_SERVICE_IP"],
		dir:          dir,
		kubectl:      filepath.Join(env["K8S_BIN"], "kubectl"),
		script:       script,
	}
	return &runningCluster{Cluster: c, cmd: cmd, stdin: stdin, log: logPath}, nil
}

// stop ends run.sh's input and waits for it to stop the cluster. The
// cluster's folder goes only if the host is clean: a mount left under it
// could lead a removal into what is mounted.
func (r *runningCluster) stop() error {
	r.stdin.Close()
	done := make(chan error, 1)
	go func() { done <- r.cmd.Wait() }()
	var err error
	select {
	case err = <-done:
	case <-time.After(5 * time.Minute):
		_ = r.cmd.Process.Signal(syscall.SIGTERM)
		err = errors.Join(errors.New("did not stop within 5 minutes"), <-done)
	}
	if err != nil {
		return fmt.Errorf("the test cluster (%s) did not stop cleanly: %w\n%s", r.dir, err, tail(r.log, 20))
	}
	os.RemoveAll(r.dir)
	os.Remove(r.log)
	return nil
}

// Kubectl runs kubectl against the cluster as its administrator and
// returns its standard output; it fails the test if kubectl fails.
func (c *Cluster) Kubectl(t testing.TB, args ...string) string {
	t.Helper()
	out, err := c.KubectlInput(nil, args...)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

// KubectlTimeout bounds each kubectl call of Kubectl, KubectlInput and
// Apply: longer than any wait a test asks of kubectl itself (rollout
// status, wait and delete --timeout), so that only a stuck call reaches
// it and fails its test instead of holding the package until go test's
// own timeout.
const KubectlTimeout = 5 * time.Minute

// KubectlInput runs kubectl with stdin as its input (nil for none) and
// returns its standard output, or an error with its standard error. It
// is stopped after KubectlTimeout.
func (c *Cluster) KubectlInput(stdin io.Reader, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), KubectlTimeout)
	defer cancel()
	return c.KubectlContext(ctx, stdin, args...)
}

// KubectlContext is KubectlInput stopped when ctx is done: a call that may
// hang (exec into a pod) gets a bound of its own.
func (c *Cluster) KubectlContext(ctx context.Context, stdin io.Reader, args ...string) (string, error) {
	cmd := c.CommandContext(ctx, args...)
	// Once kubectl is killed, do not wait on output a child may hold open.
	cmd.WaitDelay = 5 * time.Second
	cmd.Stdin = stdin
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	start := time.Now()
	if err := cmd.Run(); err != nil {
		if ctx.Err() != nil {
			err = fmt.Errorf("stopped after %s: %w", time.Since(start).Round(time.Millisecond), ctx.Err())
		}
		return stdout.String(), fmt.Errorf("kubectl %s: %w: %s", strings.Join(args, " "), err, stderr.String())
	}
	return stdout.String(), nil
}

// Command is kubectl with args, against the cluster as its administrator,
// for a test that talks to it as it runs (kubectl attach, port-forward).
func (c *Cluster) Command(args ...string) *exec.Cmd {
	return c.CommandContext(context.Background(), args...)
}

// CommandContext is Command, killed when ctx is done.
func (c *Cluster) CommandContext(ctx context.Context, args ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, c.kubectl, args...)
	cmd.Env = append(os.Environ(), "KUBECONFIG="+c.Kubeconfig)
	return cmd
}

// Apply creates or updates the objects a YAML document describes.
func (c *Cluster) Apply(t testing.TB, yaml string) {
	t.Helper()
	if _, err := c.KubectlInput(strings.NewReader(yaml), "apply", "-f", "-"); err != nil {
		t.Fatal(err)
	}
}

// ImportImage makes the local Docker image name (runner-python, …)
// available to the cluster's pods, which name it as Docker does with
// imagePullPolicy Never: nothing can be pulled here. An image imported
// before, as the same build, is not imported again, in this cluster or a
// later one.
func (c *Cluster) ImportImage(t testing.TB, name string) {
	t.Helper()
	c.importMu.Lock()
	defer c.importMu.Unlock()
	cmd := exec.Command(filepath.Join(c.script, "import.sh"), c.dir, name)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("import %s into the test cluster: %v: %s", name, err, out)
	}
}

// readEnv reads the KEY=VALUE lines of a file.
func readEnv(path string) (map[string]string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	env := map[string]string{}
	for line := range strings.Lines(string(b)) {
		if k, v, ok := strings.Cut(strings.TrimSpace(line), "="); ok {
			env[k] = v
		}
	}
	return env, nil
}

// tail returns the last n lines of a file.
func tail(path string, n int) string {
	b, _ := os.ReadFile(path)
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// repoRoot is the module's root folder, above the test's working folder.
func repoRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", err
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("go.mod not found above the test's folder")
		}
		dir = parent
	}
}
