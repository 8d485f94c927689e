package kubernetes

import (
	"context"
	"crypto/rand"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/runbox-dev/runbox/internal/agent"
	"github.com/runbox-dev/runbox/internal/sparse/sparsetest"
	"github.com/runbox-dev/runbox/internal/testenv"
)

func TestMain(m *testing.M) { os.Exit(testenv.KubernetesMain(m)) }

// cluster is the test cluster with the runner image of this tree's agent
// imported.
type cluster struct {
	*testenv.Cluster
	image string
}

var (
	imageOnce sync.Once
	imageName string
	imageErr  error
)

// testCluster starts (or finds) the cluster and imports the image pods
// run: runner-python with this tree's agent, which the runner images
// may not have yet (it awaits its executor's byte, AwaitEnv).
func testCluster(t testing.TB) cluster {
	t.Helper()
	c := testenv.Kubernetes(t)
	imageOnce.Do(func() { imageName, imageErr = buildImage() })
	if imageErr != nil {
		t.Fatal(imageErr)
	}
	c.ImportImage(t, imageName)
	return cluster{Cluster: c, image: imageName}
}

// buildImage builds runner-python:latest with this tree's agent on top,
// as Docker's runbox-k8s-test/runner-python:latest (labelled, and one
// small layer over the runner's).
func buildImage() (string, error) {
	dir, err := os.MkdirTemp("", "runbox-k8s-image-")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(dir)
	root, err := filepath.Abs("../../..")
	if err != nil {
		return "", err
	}
	build := exec.Command("go", "build", "-trimpath", "-ldflags=-s -w -buildid=", "-o", filepath.Join(dir, "agent"), "./cmd/runbox-agent")
	build.Dir = root
	build.Env = append(os.Environ(), "CGO_ENABLED=0")
	if out, err := build.CombinedOutput(); err != nil {
		return "", &cmdError{"build the agent", err, out}
	}
	dockerfile := "FROM runner-python:latest\nCOPY agent /opt/runbox/agent\nLABEL runbox.test=kubernetes\n"
	if err := os.WriteFile(filepath.Join(dir, "Dockerfile"), []byte(dockerfile), 0o644); err != nil {
		return "", err
	}
	const name = "runbox-k8s-test/runner-python:latest"
	if out, err := exec.Command("docker", "build", "-q", "-t", name, dir).CombinedOutput(); err != nil {
		return "", &cmdError{"build the test image", err, out}
	}
	return name, nil
}

type cmdError struct {
	what string
	err  error
	out  []byte
}

func (e *cmdError) Error() string { return e.what + ": " + e.err.Error() + ": " + string(e.out) }

// namespace makes a namespace for the test, deleted when it ends.
func (c cluster) namespace(t testing.TB) string {
	t.Helper()
	ns := "t-" + strings.ToLower(rand.Text()[:10])
	c.Kubectl(t, "create", "namespace", ns)
	// As deploy/kubernetes's: Pod Security admission refuses any pod
	// that is not locked down.
	c.Kubectl(t, "label", "namespace", ns, "pod-security.kubernetes.io/enforce=restricted")
	t.Cleanup(func() {
		if t.Failed() {
			out, _ := c.KubectlInput(nil, "get", "pods,events", "-n", ns, "-o", "wide")
			t.Logf("namespace %s:\n%s", ns, out)
		}
		_, _ = c.KubectlInput(nil, "delete", "namespace", ns, "--wait=false")
	})
	return ns
}

// engine returns an engine for a namespace of its own.
func (c cluster) engine(t testing.TB) *Engine {
	t.Helper()
	return c.engineWith(t, Settings{Namespace: c.namespace(t), PullPolicy: corev1.PullNever})
}

func (c cluster) engineWith(t testing.TB, s Settings) *Engine {
	t.Helper()
	cfg, err := RESTConfig(c.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	e, err := New(cfg, s)
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// spec is a python sandbox's, labelled for the test.
func (c cluster) spec(labels map[string]string) Spec {
	return Spec{
		Name: PodName("python"), Image: c.image, Labels: labels,
		Memory: 256 << 20, MilliCPU: 500, DataSize: 64 << 20,
		Tmpfs: map[string]int64{"/tmp": 64 << 20},
	}
}

// start starts a sandbox and says hello to its agent.
func start(t testing.TB, e *Engine, spec Spec) (*agent.Conn, *Stream) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var stderr strings.Builder
	s, err := e.Start(ctx, spec, &stderr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	conn := agent.NewConn(s, s)
	hello := make(chan error, 1)
	go func() { _, err := conn.Hello(); hello <- err }()
	select {
	case err = <-hello:
	case <-ctx.Done():
		err = ctx.Err()
	}
	if err != nil {
		t.Fatalf("hello: %v (agent: %s)", err, stderr.String())
	}
	return conn, s
}

// run runs code and returns its stdout and exit.
func run(t testing.TB, conn *agent.Conn, code string) (string, agent.Exit) {
	t.Helper()
	if err := conn.Start(agent.Run{Code: code}); err != nil {
		t.Fatal(err)
	}
	var out strings.Builder
	for {
		msg, err := conn.Recv()
		if err != nil {
			t.Fatalf("run %q: %v", code, err)
		}
		switch msg.Kind {
		case agent.Stdout:
			out.Write(msg.Data)
		case agent.Exited:
			return out.String(), msg.Exit
		case agent.Failed:
			t.Fatalf("run %q: %s", code, msg.Err)
		}
	}
}

func TestSandboxRunsOverAttach(t *testing.T) {
	c := testCluster(t)
	e := c.engine(t)
	spec := c.spec(map[string]string{"runbox.executor": "ex-1", "runbox.conversation": "conv~1"})
	conn, _ := start(t, e, spec)

	// A run round-trips; a second finds what the first left in /data.
	if out, exit := run(t, conn, "import os\nopen('f', 'w').write('kept')\nprint(1, os.getuid())"); out != "1 1000\n" || exit.ExitCode != 0 || !exit.Clean {
		t.Fatalf("print(1): %q, %+v", out, exit)
	}
	if out, _ := run(t, conn, "print(open('/data/f').read())"); out != "kept\n" {
		t.Fatalf("the second run read %q", out)
	}

	found, err := e.List(t.Context(), map[string]string{"runbox.conversation": "conv~1"})
	if err != nil || len(found) != 1 || found[0].Name != spec.Name || found[0].Labels["runbox.conversation"] != "conv~1" || !found[0].State.Running {
		t.Fatalf("List: %+v, %v", found, err)
	}
	if other, err := e.List(t.Context(), map[string]string{"runbox.conversation": "conv~2"}); err != nil || len(other) != 0 {
		t.Fatalf("List of another conversation: %+v, %v", other, err)
	}
}

func TestKillEndsTheStream(t *testing.T) {
	c := testCluster(t)
	e := c.engine(t)
	spec := c.spec(nil)
	conn, s := start(t, e, spec)
	if err := conn.Start(agent.Run{Code: "import time\nprint('up', flush=True)\ntime.sleep(600)"}); err != nil {
		t.Fatal(err)
	}
	if msg, err := conn.Recv(); err != nil || string(msg.Data) != "up\n" {
		t.Fatalf("first output: %+v, %v", msg, err)
	}
	if err := e.Kill(spec.Name); err != nil {
		t.Fatal(err)
	}
	select {
	case <-s.Done():
	case <-time.After(time.Minute):
		t.Fatal("the stream outlived its pod by a minute")
	}
	if _, err := conn.Recv(); err == nil {
		t.Fatal("the agent answered after its pod was killed")
	}
	if _, err := e.Inspect(t.Context(), spec.Name); err != ErrGone {
		t.Fatalf("Inspect after Kill: %v; want ErrGone", err)
	}
	if err := e.Remove(spec.Name); err != nil {
		t.Fatalf("Remove of a pod gone: %v", err)
	}
}

func TestStartFailsForAMissingImage(t *testing.T) {
	c := testCluster(t)
	e := c.engine(t)
	spec := c.spec(nil)
	spec.Image = "runner-nothing:missing"
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	_, err := e.Start(ctx, spec, nil)
	if err == nil || !strings.Contains(err.Error(), "ErrImageNeverPull") {
		t.Fatalf("Start of a missing image: %v", err)
	}
	if found, err := e.List(t.Context(), nil); err != nil || len(found) != 0 {
		t.Fatalf("left behind: %+v, %v", found, err)
	}
}

func TestReapByLabel(t *testing.T) {
	c := testCluster(t)
	e := c.engine(t)
	mine := c.spec(map[string]string{"runbox.executor": "alive"})
	dead := c.spec(map[string]string{"runbox.executor": "dead"})
	for _, sp := range []Spec{mine, dead} {
		if err := e.Create(t.Context(), sp); err != nil {
			t.Fatal(err)
		}
	}
	n, err := e.Reap(t.Context(), nil, func(sb Sandbox) bool { return sb.Labels["runbox.executor"] == "alive" }, 0)
	if err != nil || n != 1 {
		t.Fatalf("Reap: %d, %v; want 1", n, err)
	}
	left, err := e.List(t.Context(), nil)
	if err != nil || len(left) != 1 || left[0].Name != mine.Name {
		t.Fatalf("left: %+v, %v; want %s", left, err, mine.Name)
	}
}

func TestFilesGoAroundRuns(t *testing.T) {
	c := testCluster(t)
	e := c.engine(t)
	spec := c.spec(nil)
	dir := filepath.Join(t.TempDir(), "slot")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "in.csv"), []byte("a,b\n1,2\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	held, err := holdFolder(dir)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	s, err := e.Start(ctx, spec, nil)
	if err != nil {
		t.Fatal(err)
	}
	synced := syncFiles(s, &folderCopier{e: e, pod: spec.Name, dir: held, quota: agent.Quota{Bytes: 1 << 20}})
	t.Cleanup(func() {
		synced.Close()
		s.Close()
		held.Close()
	})
	conn := agent.NewConn(synced, synced)
	if _, err := conn.Hello(); err != nil {
		t.Fatal(err)
	}

	// The run finds the folder's file, and its own files are in the
	// folder when its exit is read.
	code := "import os\nprint(open('in.csv').read().count('\\n'))\nos.makedirs('out', exist_ok=True)\nopen('out/r.txt', 'w').write('done')"
	if out, exit := run(t, conn, code); out != "2\n" || exit.ExitCode != 0 {
		t.Fatalf("run: %q, %+v", out, exit)
	}
	if b, err := os.ReadFile(filepath.Join(dir, "out", "r.txt")); err != nil || string(b) != "done" {
		t.Fatalf("out/r.txt in the folder: %q, %v", b, err)
	}
	// A file the executor changes between runs reaches the next; one the
	// program removes leaves the folder.
	if err := os.WriteFile(filepath.Join(dir, "in.csv"), []byte("a\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, _ := run(t, conn, "import os\nos.remove('out/r.txt')\nprint(open('in.csv').read())"); out != "a\n\n" {
		t.Fatalf("second run: %q", out)
	}
	if _, err := os.Stat(filepath.Join(dir, "out", "r.txt")); !os.IsNotExist(err) {
		t.Fatalf("out/r.txt still in the folder: %v", err)
	}
	// The folder renamed (a pooled sandbox's slot becoming a new
	// conversation's folder, package files): the copies follow it.
	moved := filepath.Join(filepath.Dir(dir), "conversation")
	if err := os.Rename(dir, moved); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(moved, "in.csv"), []byte("b\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, _ := run(t, conn, "print(open('in.csv').read())\nopen('after.txt', 'w').write('moved')"); out != "b\n\n" {
		t.Fatalf("run after the rename: %q", out)
	}
	if b, err := os.ReadFile(filepath.Join(moved, "after.txt")); err != nil || string(b) != "moved" {
		t.Fatalf("after.txt in the renamed folder: %q, %v", b, err)
	}
	// A sparse file the program makes comes out with its holes (tar
	// carries them as zeros).
	code = fmt.Sprintf("f = open('sparse', 'wb')\nf.write(b%[1]q)\nf.seek(%[2]d)\nf.write(b%[1]q)\nf.truncate(%[3]d)",
		sparsetest.Data, 512<<10-4096, 512<<10)
	if out, exit := run(t, conn, code); exit.ExitCode != 0 {
		t.Fatalf("the sparse file's run: %q, %+v", out, exit)
	}
	sparsetest.Check(t, filepath.Join(moved, "sparse"), 512<<10)
}
