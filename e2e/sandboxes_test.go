package e2e

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/moby/moby/client"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/runbox-dev/runbox/internal/sandbox"
	"github.com/runbox-dev/runbox/internal/sandbox/docker/dockertest"
	k8s "github.com/runbox-dev/runbox/internal/sandbox/kubernetes"
	"github.com/runbox-dev/runbox/internal/testenv"
)

// onKubernetes: the suite's executors run their sandboxes as pods of the
// test cluster (E2E_ENGINE=kubernetes, make test-e2e-kubernetes), not as
// containers of the Docker Engine.
var onKubernetes = os.Getenv("E2E_ENGINE") == "kubernetes"

// k8sRuntimeClass is the RuntimeClass of the pass's sandbox pods
// (E2E_K8S_RUNTIME_CLASS=runsc: gVisor); unset, the cluster's default.
var k8sRuntimeClass = os.Getenv("E2E_K8S_RUNTIME_CLASS")

// k8sLanguages are the runners imported into the test cluster: those the
// tests of the Kubernetes pass run (each costs an import of its image).
var k8sLanguages = []string{"bash", "python", "typescript"}

// offeredLanguages are the runners the executors offer.
func offeredLanguages() []string {
	if onKubernetes {
		return k8sLanguages
	}
	return allLanguages
}

// sandboxes is what the tests see of an engine's sandboxes, each known
// by its host name (a container's short id, a pod's name), which a
// program reads from /etc/hostname.
type sandboxes interface {
	// hosts returns the host names of an executor's sandboxes.
	hosts(t testing.TB, executor string) map[string]bool
	exists(t testing.TB, host string) bool
	// executorOf returns the executor a sandbox belongs to.
	executorOf(t testing.TB, host string) string
}

// dockerSandboxes are containers of the Docker Engine.
type dockerSandboxes struct{ c *client.Client }

func (d dockerSandboxes) hosts(t testing.TB, executor string) map[string]bool {
	res, err := d.c.ContainerList(context.Background(), client.ContainerListOptions{
		All: true, Filters: client.Filters{}.Add("label", sandbox.LabelExecutor+"="+executor),
	})
	if err != nil {
		t.Fatal(err)
	}
	ids := map[string]bool{}
	for _, c := range res.Items {
		ids[c.ID[:12]] = true
	}
	return ids
}

func (d dockerSandboxes) exists(t testing.TB, host string) bool {
	_, err := d.c.ContainerInspect(context.Background(), strings.TrimSpace(host), client.ContainerInspectOptions{})
	return err == nil
}

func (d dockerSandboxes) executorOf(t testing.TB, host string) string {
	info, err := d.c.ContainerInspect(context.Background(), strings.TrimSpace(host), client.ContainerInspectOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return info.Container.Config.Labels[sandbox.LabelExecutor]
}

// pods are sandbox pods of the test cluster, in one namespace.
type pods struct {
	c  kubernetes.Interface
	ns string
}

func (p pods) hosts(t testing.TB, executor string) map[string]bool {
	list, err := p.c.CoreV1().Pods(p.ns).List(context.Background(), metav1.ListOptions{
		LabelSelector: sandbox.LabelExecutor + "=" + k8s.LabelValue(executor),
	})
	if err != nil {
		t.Fatal(err)
	}
	names := map[string]bool{}
	for _, pod := range list.Items {
		names[pod.Name] = true
	}
	return names
}

func (p pods) exists(t testing.TB, host string) bool {
	_, err := p.c.CoreV1().Pods(p.ns).Get(context.Background(), strings.TrimSpace(host), metav1.GetOptions{})
	if err != nil && !apierrors.IsNotFound(err) {
		t.Fatal(err)
	}
	return err == nil
}

func (p pods) executorOf(t testing.TB, host string) string {
	pod, err := p.c.CoreV1().Pods(p.ns).Get(context.Background(), strings.TrimSpace(host), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if v, ok := pod.Annotations[k8s.AnnotationPrefix+sandbox.LabelExecutor]; ok {
		return v
	}
	return pod.Labels[sandbox.LabelExecutor]
}

// readAll returns what the file path holds in each running sandbox pod
// that has it, one after the other: a pod's /data reaches its executor's
// folder only after a run, so what a run cut short wrote is read there.
func (p pods) readAll(t testing.TB, k *testenv.Cluster, path string) string {
	list, err := p.c.CoreV1().Pods(p.ns).List(context.Background(), metav1.ListOptions{
		LabelSelector: k8s.LabelSandbox + "=true", FieldSelector: "status.phase=Running",
	})
	if err != nil {
		t.Fatal(err)
	}
	var all strings.Builder
	for _, pod := range list.Items {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		out, err := k.KubectlContext(ctx, nil, "-n", p.ns, "exec", pod.Name, "-c", k8s.Container, "--",
			"cat", path)
		cancel()
		if err != nil && !strings.Contains(err.Error(), "No such file") {
			t.Logf("read %s in pod %s: %v", path, pod.Name, err)
		}
		all.WriteString(out)
	}
	return all.String()
}

// engineFor returns the sandboxes the service's executors make, and the
// settings that have them made there.
func engineFor(t testing.TB, engine string) (sandboxes, []string) {
	t.Helper()
	if engine == "docker" || engine == "" && !onKubernetes {
		return dockerSandboxes{dockertest.Client(t)}, nil
	}
	k := testCluster(t)
	return k.pods, []string{"SANDBOX_ENGINE=kubernetes", "KUBECONFIG=" + k.cluster.Kubeconfig,
		"SANDBOX_K8S_NAMESPACE=" + k.pods.ns, "SANDBOX_RUNNERS_FILE=" + k.runners,
		"SANDBOX_K8S_RUNTIME_CLASS=" + k8sRuntimeClass}
}

// cluster is the test cluster as the suite uses it: a namespace for
// sandboxes as deploy/kubernetes makes it (Pod Security's restricted
// level, every pod's traffic denied), the runner images of k8sLanguages
// imported, and their list (SANDBOX_RUNNERS_FILE).
type cluster struct {
	cluster *testenv.Cluster
	pods    pods
	runners string
}

var (
	clusterOnce  sync.Once
	clusterSetUp *cluster
)

// testCluster starts the cluster and sets it up for the suite, once; a
// test after a failed setup fails too.
func testCluster(t testing.TB) *cluster {
	t.Helper()
	clusterOnce.Do(func() { clusterSetUp = setUpCluster(t) })
	if clusterSetUp == nil {
		t.Fatal("the test cluster's setup failed (see the first test that asked for it)")
	}
	return clusterSetUp
}

// namespacePolicy is deploy/kubernetes's for the sandboxes' namespace,
// at Pod Security's level %[2]s.
const namespacePolicy = `apiVersion: v1
kind: Namespace
metadata:
  name: %[1]s
  labels: {pod-security.kubernetes.io/enforce: %[2]s}
---
apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: sandboxes-deny-all, namespace: %[1]s}
spec:
  podSelector: {}
  policyTypes: [Ingress, Egress]
`

func setUpCluster(t testing.TB) *cluster {
	c := testenv.Kubernetes(t)
	const ns = "runbox-e2e"
	level := "restricted"
	if k8sRuntimeClass == "runsc" {
		// Under gVisor the agent runs as root with the capabilities it
		// starts programs with, inside gVisor's kernel: deploy/kubernetes's
		// gvisor component admits that by its own policy (tested in
		// deploy/kubernetes), which this namespace does not repeat.
		level = "privileged"
	}
	c.Apply(t, fmt.Sprintf(namespacePolicy, ns, level))
	for _, l := range k8sLanguages {
		c.ImportImage(t, "runner-"+l+":latest")
	}
	list := exec.Command(filepath.Join(testenv.RepoRoot(t), "deploy", "runners-list.sh"))
	list.Env = append(os.Environ(), "LANGUAGES="+strings.Join(k8sLanguages, " "))
	out, err := list.Output()
	if err != nil {
		t.Fatalf("runners-list.sh: %v", err)
	}
	runners := filepath.Join(bin.dir, "runners.json")
	if err := os.WriteFile(runners, out, 0o644); err != nil {
		t.Fatal(err)
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", c.Kubeconfig)
	if err != nil {
		t.Fatal(err)
	}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return &cluster{cluster: c, pods: pods{c: client, ns: ns}, runners: runners}
}
