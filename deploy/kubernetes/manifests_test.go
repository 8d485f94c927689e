// Package kubernetes holds the tests of runbox's Kubernetes manifests
// (base/, and the test's overlay of them, test/), against the real
// single-node cluster of deploy/k8s-cluster.
package kubernetes

import (
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/runbox-dev/runbox/internal/testenv"
)

func TestMain(m *testing.M) { os.Exit(testenv.KubernetesMain(m)) }

const (
	namespace = "runbox"
	sandboxes = "runbox-sandboxes"
	executor  = "system:serviceaccount:runbox-sandboxes:executor"
)

// apply makes the namespaces and the sandboxes' policy and rights for real
// (the rest of the manifests need images and a Secret). They stay for the
// package's other tests; the cluster goes at the end.
func apply(t *testing.T, c *testenv.Cluster) {
	t.Helper()
	c.Kubectl(t, "apply", "-f", "base/namespaces.yaml", "-f", "base/sandboxes.yaml", "-f", "base/rbac.yaml")
}

func TestManifestsAreValid(t *testing.T) {
	c := testenv.Kubernetes(t)
	apply(t, c)
	// Every object, through the API server's validation and admission,
	// without being made.
	out := c.Kubectl(t, "apply", "-k", "base", "--dry-run=server", "-o", "name")
	for _, want := range []string{
		"deployment.apps/api", "deployment.apps/executor", "statefulset.apps/redis", "statefulset.apps/versitygw",
		"service/api", "service/redis", "service/versitygw",
		"networkpolicy.networking.k8s.io/sandboxes-deny-all", "networkpolicy.networking.k8s.io/executors",
		"networkpolicy.networking.k8s.io/redis", "networkpolicy.networking.k8s.io/versitygw",
		"role.rbac.authorization.k8s.io/executor", "rolebinding.rbac.authorization.k8s.io/executor",
		"validatingadmissionpolicy.admissionregistration.k8s.io/runbox-sandbox-pods",
	} {
		if !strings.Contains(out, want+"\n") {
			t.Errorf("kubectl apply -k printed no %s:\n%s", want, out)
		}
	}
}

// TestExecutorRights: the executor's service account may make and drive
// sandboxes' pods in their namespace and do nothing else.
func TestExecutorRights(t *testing.T) {
	c := testenv.Kubernetes(t)
	apply(t, c)
	for _, tc := range []struct {
		verb, resource, ns string
		want               string
	}{
		{"create", "pods", sandboxes, "yes"},
		{"delete", "pods", sandboxes, "yes"},
		{"list", "pods", sandboxes, "yes"},
		{"watch", "pods", sandboxes, "yes"},
		{"create", "pods/attach", sandboxes, "yes"},
		{"get", "pods/attach", sandboxes, "yes"},
		{"create", "pods/exec", sandboxes, "yes"},
		{"get", "pods/log", sandboxes, "yes"},
		{"update", "pods", sandboxes, "no"},
		{"patch", "pods", sandboxes, "no"},
		{"update", "pods/ephemeralcontainers", sandboxes, "no"},
		{"create", "pods/portforward", sandboxes, "no"},
		{"get", "secrets", sandboxes, "no"},
		{"get", "configmaps", sandboxes, "no"},
		{"create", "serviceaccounts/token", sandboxes, "no"},
		{"delete", "networkpolicies", sandboxes, "no"},
		{"create", "rolebindings", sandboxes, "no"},
		{"get", "pods", namespace, "no"},
		{"create", "pods/exec", namespace, "no"},
		{"get", "secrets", namespace, "no"},
		{"create", "pods", "default", "no"},
		{"list", "nodes", "", "no"},
		{"create", "namespaces", "", "no"},
		{"delete", "validatingadmissionpolicies", "", "no"},
	} {
		// can-i reads pods/exec as the pod named exec: a subresource is
		// asked for on its own.
		resource, sub, _ := strings.Cut(tc.resource, "/")
		args := []string{"auth", "can-i", tc.verb, resource, "--subresource=" + sub, "--as", executor}
		if tc.ns != "" {
			args = append(args, "-n", tc.ns)
		}
		// can-i exits 1 for "no".
		out, _ := c.KubectlInput(nil, args...)
		if got := strings.TrimSpace(out); got != tc.want {
			t.Errorf("can the executor %s %s in %q: %q; want %q", tc.verb, tc.resource, tc.ns, got, tc.want)
		}
	}
}

// sandboxPod is a pod in runbox-sandboxes locked down as sandboxes are,
// with extra spliced into its spec (indented by two spaces) and labels
// as its labels (a YAML flow mapping).
func sandboxPod(labels, extra string) string {
	return fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata: {name: sandbox, namespace: runbox-sandboxes, labels: %s}
spec:
  automountServiceAccountToken: false
  enableServiceLinks: false
  securityContext:
    runAsNonRoot: true
    runAsUser: 1000
    seccompProfile: {type: RuntimeDefault}
  containers:
  - name: main
    image: runner-python:latest
    securityContext:
      allowPrivilegeEscalation: false
      readOnlyRootFilesystem: true
      capabilities: {drop: [ALL]}
%s`, labels, extra)
}

// TestSandboxNamespaceRefusesUnsafePods: with pods/create in
// runbox-sandboxes, an executor could otherwise make a privileged pod that
// mounts the node, or one that carries its own token or the executors'
// label; Pod Security admission and the manifests' admission policy
// refuse them, and take a pod locked down as sandboxes are.
func TestSandboxNamespaceRefusesUnsafePods(t *testing.T) {
	c := testenv.Kubernetes(t)
	apply(t, c)
	// As the executor, through admission, without making the pod.
	create := func(yaml string) error {
		_, err := c.KubectlInput(strings.NewReader(yaml), "create", "--dry-run=server", "--as", executor, "-f", "-")
		return err
	}
	if err := create(sandboxPod(`{runbox.conversation: c1}`, "")); err != nil {
		t.Fatalf("a locked-down pod was refused: %v", err)
	}
	for _, tc := range []struct {
		name, yaml string
		by         string // what refuses it
	}{
		{"privileged", strings.Replace(sandboxPod("{}", ""), "allowPrivilegeEscalation: false", "privileged: true", 1), "PodSecurity"},
		{"the node's root", sandboxPod("{}", `    volumeMounts: [{name: root, mountPath: /host}]
  volumes:
  - name: root
    hostPath: {path: /}
`), "PodSecurity"},
		{"the host's network", sandboxPod("{}", "  hostNetwork: true\n"), "PodSecurity"},
		{"root", strings.Replace(sandboxPod("{}", ""), "runAsUser: 1000", "runAsUser: 0", 1), "PodSecurity"},
		{"the executors' label", sandboxPod(`{app.kubernetes.io/name: executor}`, ""), "runbox-sandbox-pods"},
		{"a token", strings.Replace(sandboxPod("{}", ""), "automountServiceAccountToken: false", "automountServiceAccountToken: true", 1), "runbox-sandbox-pods"},
		{"no word on its token", strings.Replace(sandboxPod("{}", ""), "  automountServiceAccountToken: false\n", "", 1), "runbox-sandbox-pods"},
		{"a Secret", sandboxPod("{}", `    volumeMounts: [{name: s, mountPath: /s}]
  volumes:
  - name: s
    secret: {secretName: runbox}
`), "runbox-sandbox-pods"},
	} {
		err := create(tc.yaml)
		if err == nil || !strings.Contains(err.Error(), tc.by) {
			t.Errorf("a pod with %s: %v; want refused by %s", tc.name, err, tc.by)
		}
	}
}

// gvisorPod is a sandbox as the engine makes one under gVisor: the agent
// as root with its capabilities, in the RuntimeClass runsc; edit changes
// its YAML.
func gvisorPod(edit func(string) string) string {
	return edit(`apiVersion: v1
kind: Pod
metadata: {name: sandbox, namespace: runbox-sandboxes, labels: {runbox.sandbox: "true"}}
spec:
  runtimeClassName: runsc
  automountServiceAccountToken: false
  enableServiceLinks: false
  securityContext:
    runAsUser: 0
    seccompProfile: {type: RuntimeDefault}
  containers:
  - name: main
    image: runner-python:latest
    securityContext:
      allowPrivilegeEscalation: false
      readOnlyRootFilesystem: true
      capabilities:
        drop: [ALL]
        add: [SETUID, SETGID, KILL, SYS_RESOURCE, SYS_NICE, FOWNER, DAC_OVERRIDE, CHOWN]
`)
}

// TestGVisorComponent: with the gvisor component, the executors may make
// the gVisor sandbox the restricted level refuses, and only under gVisor;
// its admission policy refuses what Pod Security no longer does.
func TestGVisorComponent(t *testing.T) {
	c := testenv.Kubernetes(t)
	apply(t, c)
	// The component's namespace and policies alone, as the overlay makes
	// them; the base's again at the end, for the package's other tests.
	var docs []string
	for doc := range strings.SplitSeq(c.Kubectl(t, "kustomize", "test-gvisor"), "\n---\n") {
		if strings.Contains(doc, "\nkind: Namespace\n") || strings.Contains(doc, "\nkind: ValidatingAdmissionPolicy") {
			docs = append(docs, doc)
		}
	}
	t.Cleanup(func() {
		_, _ = c.KubectlInput(nil, "delete", "validatingadmissionpolicybinding,validatingadmissionpolicy", "runbox-sandbox-pods-gvisor")
		apply(t, c)
	})
	c.Apply(t, strings.Join(docs, "\n---\n"))

	create := func(yaml string) error {
		_, err := c.KubectlInput(strings.NewReader(yaml), "create", "--dry-run=server", "--as", executor, "-f", "-")
		return err
	}
	if err := create(gvisorPod(func(s string) string { return s })); err != nil {
		t.Fatalf("a gVisor sandbox was refused: %v", err)
	}
	// The API server takes up a new policy a moment after it is made:
	// until it refuses a pod with no RuntimeClass.
	noRuntime := gvisorPod(func(s string) string { return strings.Replace(s, "  runtimeClassName: runsc\n", "", 1) })
	for deadline := time.Now().Add(time.Minute); create(noRuntime) == nil && time.Now().Before(deadline); {
		time.Sleep(500 * time.Millisecond)
	}
	for _, tc := range []struct{ name, old, new string }{
		{"no RuntimeClass", "  runtimeClassName: runsc\n", ""},
		{"privileged", "allowPrivilegeEscalation: false", "privileged: true"},
		{"the host's network", "  enableServiceLinks: false\n", "  enableServiceLinks: false\n  hostNetwork: true\n"},
		{"SYS_ADMIN", "CHOWN]", "CHOWN, SYS_ADMIN]"},
		{"no seccomp", "    seccompProfile: {type: RuntimeDefault}\n", ""},
		{"a host port", "    image: runner-python:latest\n", "    image: runner-python:latest\n    ports: [{containerPort: 80, hostPort: 80}]\n"},
	} {
		yaml := gvisorPod(func(s string) string { return strings.Replace(s, tc.old, tc.new, 1) })
		err := create(yaml)
		if err == nil || !strings.Contains(err.Error(), "runbox-sandbox-pods-gvisor") {
			t.Errorf("a gVisor sandbox with %s: %v; want refused by runbox-sandbox-pods-gvisor", tc.name, err)
		}
	}
}

// TestSandboxesAreIsolated: the manifests' NetworkPolicy holds for any
// pod in runbox-sandboxes, labelled or not: it reaches neither the API
// server nor cluster DNS (TCP), which a pod in runbox reaches.
func TestSandboxesAreIsolated(t *testing.T) {
	c := testenv.Kubernetes(t)
	c.ImportImage(t, "runner-python:latest")
	apply(t, c)
	// The same pod in runbox and in runbox-sandboxes: the first shows that
	// the probes can reach their targets.
	for _, ns := range []string{namespace, sandboxes} {
		c.Apply(t, fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata: {name: sandbox, namespace: %s}
spec:
  automountServiceAccountToken: false
  enableServiceLinks: false
  securityContext:
    runAsNonRoot: true
    runAsUser: 1000
    seccompProfile: {type: RuntimeDefault}
  containers:
  - name: main
    image: runner-python:latest
    imagePullPolicy: Never
    command: [python3, -c, "import time; time.sleep(86400)"]
    securityContext:
      allowPrivilegeEscalation: false
      readOnlyRootFilesystem: true
      capabilities: {drop: [ALL]}
`, ns))
		c.Kubectl(t, "wait", "-n", ns, "--for=condition=Ready", "pod/sandbox", "--timeout=180s")
	}
	probe := `import socket, sys
try:
    socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=3).close()
    print("open")
except Exception as e:
    print("closed:", type(e).__name__)`
	api := strings.TrimPrefix(c.API, "https://")
	host, port, _ := strings.Cut(api, ":")
	for _, target := range [][2]string{{c.APIServiceIP, "443"}, {host, port}, {c.DNSServiceIP, "53"}} {
		for _, ns := range []string{namespace, sandboxes} {
			want := map[string]string{namespace: "open", sandboxes: "closed"}[ns]
			if out := execUntil(t, c, ns, "sandbox", want, "python3", "-c", probe, target[0], target[1]); !strings.HasPrefix(out, want) {
				t.Fatalf("the pod in %s reaching %s: %s; want %s", ns, strings.Join(target[:], ":"), out, want)
			}
		}
	}
}
