package kubernetes

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"

	"github.com/runbox-dev/runbox/internal/agent"
	"github.com/runbox-dev/runbox/internal/sandbox"
	"github.com/runbox-dev/runbox/internal/sandbox/engine"
)

// roomMemory returns a pod memory size of which n pods fit in what the
// node has left to allocate and n+1 do not: the memory a pod requests is
// its limit, so a few large ones fill the node as many idle sandboxes
// fill a small one's CPU.
func roomMemory(t *testing.T, c cluster, e *Engine, n int) int64 {
	t.Helper()
	node, err := e.client.CoreV1().Nodes().Get(t.Context(), c.Node, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	// A pod going (an earlier test's namespace being deleted) would give
	// its room back midway: wait until none is.
	var pods *corev1.PodList
	for deadline := time.Now().Add(2 * time.Minute); ; time.Sleep(time.Second) {
		pods, err = e.client.CoreV1().Pods("").List(t.Context(), metav1.ListOptions{
			FieldSelector: fields.OneTermEqualSelector("spec.nodeName", c.Node).String(),
		})
		if err != nil {
			t.Fatal(err)
		}
		if !slices.ContainsFunc(pods.Items, func(p corev1.Pod) bool { return p.DeletionTimestamp != nil }) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("pods of the node still going after 2 minutes")
		}
	}
	free := node.Status.Allocatable.Memory().Value()
	for _, p := range pods.Items {
		if p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed {
			continue
		}
		for _, ct := range p.Spec.Containers {
			free -= ct.Resources.Requests.Memory().Value()
		}
	}
	// n of them take n/(n+½) of it; one more would need more than all.
	size := free * 2 / int64(2*n+1)
	t.Logf("node %s: %d MiB of memory left to allocate; pods of %d MiB", c.Node, free>>20, size>>20)
	return size
}

// TestNoRoomFailsFast: a pod the node has no room for fails its Create
// with engine.ErrNoRoom as soon as the scheduler says so, and is
// removed; once a pod goes, the same Create succeeds.
func TestNoRoomFailsFast(t *testing.T) {
	c := testCluster(t)
	e := c.engine(t)
	// Gone before the next test measures the node's room.
	t.Cleanup(func() { _, _ = e.Reap(context.Background(), nil, nil, 0) })
	mem := roomMemory(t, c, e, 2)
	var specs []Spec
	for range 2 {
		spec := c.spec(nil)
		spec.Memory = mem
		ctx, cancel := context.WithTimeout(t.Context(), 2*time.Minute)
		err := e.Create(ctx, spec)
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		specs = append(specs, spec)
	}

	extra := c.spec(nil)
	extra.Memory = mem
	// Bounded well below the janitor's minute: a pod left waiting for
	// room fails with the context's error instead.
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	begin := time.Now()
	err := e.Create(ctx, extra)
	if !errors.Is(err, engine.ErrNoRoom) {
		t.Fatalf("Create beyond the node's room: %v; want ErrNoRoom", err)
	}
	t.Logf("no room, after %d ms: %v", time.Since(begin).Milliseconds(), err)
	if _, err := e.Inspect(t.Context(), extra.Name); err != ErrGone {
		t.Fatalf("the pod without room was left: %v", err)
	}

	if err := e.Remove(specs[0].Name); err != nil {
		t.Fatal(err)
	}
	ctx, cancel = context.WithTimeout(t.Context(), 2*time.Minute)
	defer cancel()
	begin = time.Now()
	if err := e.Create(ctx, extra); err != nil {
		t.Fatalf("Create once a pod went: %v", err)
	}
	t.Logf("room once a pod went: running after %d ms", time.Since(begin).Milliseconds())
}

// TestManagerMakesRoom: through the sandbox manager, a run whose sandbox
// the node has no room for removes the conversation's sandbox idle
// longest and runs.
func TestManagerMakesRoom(t *testing.T) {
	c := testCluster(t)
	e := c.engine(t)
	mem := roomMemory(t, c, e, 2)
	eng := &Sandboxes{Engine: e, Quota: agent.Quota{Bytes: 64 << 20}, ImageList: c.images}
	m := manager(t, eng, sandbox.Options{ExecutorID: "ex-room",
		Limits:  sandbox.Limits{Memory: mem, NanoCPUs: 1e9, Pids: 256},
		MaxWarm: sandbox.WarmLimits{Default: 8}})
	run := func(conv string) {
		t.Helper()
		dir := filepath.Join(t.TempDir(), conv)
		if err := os.Mkdir(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
		defer cancel()
		var out strings.Builder
		begin := time.Now()
		oc, err := m.Run(ctx, sandbox.Request{RunID: "run-" + conv, ConversationID: conv, Language: "python",
			Code: "print(1)", Timeout: time.Minute, DataDir: dir},
			func(s sandbox.Stream, p []byte) { out.Write(p) })
		if err != nil || oc.ExitCode != 0 || out.String() != "1\n" {
			t.Fatalf("run of %s: %+v, %q, %v", conv, oc, out.String(), err)
		}
		t.Logf("run of %s: %d ms", conv, time.Since(begin).Milliseconds())
	}
	pods := func(conv string) int {
		t.Helper()
		found, err := e.List(t.Context(), map[string]string{sandbox.LabelConversation: conv})
		if err != nil {
			t.Fatal(err)
		}
		return len(found)
	}

	run("a")
	run("b")
	// The node is full of a's and b's idle sandboxes: c's run removes
	// a's, idle longest, and runs.
	run("c")
	if n := m.Warm(); n != 2 {
		t.Errorf("%d warm sandboxes, want b's and c's", n)
	}
	if pods("a") != 0 || pods("b") != 1 || pods("c") != 1 {
		t.Errorf("pods of a, b, c: %d, %d, %d; want 0, 1, 1", pods("a"), pods("b"), pods("c"))
	}
}

// images lists the cluster's one runner image, python's, as a runner
// list would (Sandboxes.ImageList).
func (c cluster) images(context.Context, string) ([]engine.Image, error) {
	return []engine.Image{{Tags: []string{c.image}, Labels: map[string]string{
		sandbox.LabelRunner: "true", sandbox.LabelLanguage: "python"}}}, nil
}

// manager is a sandbox manager of eng's pods, shut down when the test
// ends.
func manager(t *testing.T, eng *Sandboxes, opts sandbox.Options) *sandbox.Manager {
	t.Helper()
	m := sandbox.NewManager(eng, opts)
	if _, err := m.Discover(t.Context()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		defer cancel()
		if err := m.Shutdown(ctx); err != nil {
			t.Error(err)
		}
	})
	return m
}
