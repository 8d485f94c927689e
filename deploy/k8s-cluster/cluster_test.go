// Package k8scluster holds the tests of the single-node Kubernetes the
// integration tests run against (deploy/k8s-cluster): pods run as runbox's
// Kubernetes sandboxes will, attach with stdin works, Services and cluster
// DNS answer, NetworkPolicy is enforced, and gVisor runs as the
// RuntimeClass "runsc".
package k8scluster

import (
	"bufio"
	"cmp"
	"crypto/rand"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/runbox-dev/runbox/internal/testenv"
)

func TestMain(m *testing.M) { os.Exit(testenv.KubernetesMain(m)) }

// image is the runner the pods run.
const image = "runner-python:latest"

// sandboxLabel marks a pod as a sandbox: the NetworkPolicy of
// deploy/kubernetes denies such pods all traffic.
const sandboxLabel = "runbox.sandbox"

// namespace makes a namespace for the test, deleted when it ends.
func namespace(t *testing.T, c *testenv.Cluster) string {
	t.Helper()
	ns := "t-" + strings.ToLower(rand.Text()[:10])
	c.Kubectl(t, "create", "namespace", ns)
	t.Cleanup(func() {
		if t.Failed() {
			out, _ := c.KubectlInput(nil, "get", "pods,events", "-n", ns, "-o", "wide")
			t.Logf("namespace %s:\n%s", ns, out)
		}
		_, _ = c.KubectlInput(nil, "delete", "namespace", ns, "--wait=false")
	})
	return ns
}

// pod is a pod of the runner image with the security context runbox's
// sandboxes have, running command.
type pod struct {
	name, namespace string
	labels          string // YAML flow mapping: {a: b}
	runtimeClass    string
	stdin           bool
	command         []string
}

func (p pod) yaml() string {
	labels := p.labels
	if labels == "" {
		labels = "{}"
	}
	extra := ""
	if p.runtimeClass != "" {
		extra = "\n  runtimeClassName: " + p.runtimeClass
	}
	return fmt.Sprintf(`apiVersion: v1
kind: Pod
metadata:
  name: %s
  namespace: %s
  labels: %s
spec:%s
  restartPolicy: Never
  automountServiceAccountToken: false
  enableServiceLinks: false
  securityContext:
    runAsNonRoot: true
    runAsUser: 1000
    runAsGroup: 1000
    seccompProfile: {type: RuntimeDefault}
  containers:
  - name: main
    image: %s
    imagePullPolicy: Never
    stdin: %t
    command: %s
    securityContext:
      allowPrivilegeEscalation: false
      readOnlyRootFilesystem: true
      capabilities: {drop: [ALL]}
`, p.name, p.namespace, labels, extra, image, p.stdin, mustJSON(p.command))
}

func mustJSON(args []string) string {
	quoted := make([]string, len(args))
	for i, a := range args {
		quoted[i] = fmt.Sprintf("%q", a)
	}
	return "[" + strings.Join(quoted, ", ") + "]"
}

// run creates the pod and waits until it is Ready.
func run(t *testing.T, c *testenv.Cluster, p pod) {
	t.Helper()
	c.Apply(t, p.yaml())
	c.Kubectl(t, "wait", "-n", p.namespace, "--for=condition=Ready", "pod/"+p.name, "--timeout=180s")
}

func TestSandboxPodRunsAndAttaches(t *testing.T) {
	c := testenv.Kubernetes(t)
	c.ImportImage(t, image)
	ns := namespace(t, c)
	// The agent stands in for runbox's: it answers each line on its
	// standard input, saying who it runs as and whether it can write its
	// root filesystem.
	agent := `import os, sys
try:
    open("/probe", "w")
    root = "writable"
except OSError:
    root = "read-only"
for line in sys.stdin:
    print(os.getuid(), root, line.strip()[::-1], flush=True)`
	run(t, c, pod{name: "agent", namespace: ns, stdin: true, command: []string{"python3", "-u", "-c", agent}})

	// Twice: a second attach finds the same agent.
	for _, word := range []string{"hello", "again"} {
		got := attach(t, c, ns, "agent", word)
		want := "1000 read-only " + reverse(word)
		if got != want {
			t.Fatalf("the agent answered %q to %q; want %q", got, word, want)
		}
	}
}

func reverse(s string) string {
	b := []byte(s)
	for i, j := 0, len(b)-1; i < j; i, j = i+1, j-1 {
		b[i], b[j] = b[j], b[i]
	}
	return string(b)
}

// attach attaches to the pod's standard input and output (kubectl attach
// -i, over the API server and the kubelet, as the engine's executor will
// through client-go), writes line and returns the first line it reads.
func attach(t *testing.T, c *testenv.Cluster, ns, name, line string) string {
	t.Helper()
	cmd := c.Command("attach", "-i", "-n", ns, name, "-c", "main")
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		stdin.Close()
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	}()
	got := make(chan string, 1)
	go func() {
		r := bufio.NewReader(stdout)
		s, _ := r.ReadString('\n')
		got <- strings.TrimSpace(s)
		_, _ = io.Copy(io.Discard, r)
	}()
	// kubectl sends what it reads once the stream is up; a line written
	// before is not lost.
	if _, err := io.WriteString(stdin, line+"\n"); err != nil {
		t.Fatal(err)
	}
	select {
	case s := <-got:
		if s == "" {
			t.Fatalf("attach to %s: no answer: %s", name, stderr.String())
		}
		return s
	case <-time.After(2 * time.Minute):
		t.Fatalf("attach to %s: no answer within 2 minutes: %s", name, stderr.String())
		return ""
	}
}

// probe is a Python program that connects to argv[1]:argv[2], sends
// argv[3] and prints "open" if what it reads back contains argv[4] (or,
// with no argv[4], as soon as it is connected), else why not.
const probe = `import socket, sys
host, port, send, expect = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
try:
    s = socket.create_connection((host, port), timeout=3)
    s.settimeout(3)
    if send:
        s.sendall(send.encode())
    data = s.recv(256) if expect else b""
    print("open" if expect.encode() in data else "answered %r" % data)
except Exception as e:
    print("closed:", type(e).__name__, e)`

// resolve is a Python program that prints the address argv[1] resolves
// to, or why it does not.
const resolve = `import socket, sys
try:
    print(socket.gethostbyname(sys.argv[1]))
except Exception as e:
    print("unresolved:", type(e).__name__, e)`

// target is somewhere a pod may try to reach.
type target struct {
	name         string
	host         string
	port         int
	send, expect string
}

func TestNetworkPolicyIsolatesSandboxes(t *testing.T) {
	c := testenv.Kubernetes(t)
	c.ImportImage(t, image)
	ns := namespace(t, c)

	redis := redisOn(t, c.NodeIP)
	internet := listenerOutsideCluster(t, c)
	_, apiPort, _ := net.SplitHostPort(strings.TrimPrefix(c.API, "https://"))
	targets := []target{
		{name: "the API server's Service", host: c.APIServiceIP, port: 443},
		{name: "the API server on the node", host: c.NodeIP, port: atoi(t, apiPort)},
		{name: "Redis on the node", host: c.NodeIP, port: redis, send: "PING\r\n", expect: "+PONG"},
		{name: "an address outside the cluster", host: internet.host, port: internet.port, expect: "hello"},
	}

	c.Apply(t, fmt.Sprintf(`apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata:
  name: sandboxes-deny-all
  namespace: %s
spec:
  podSelector:
    matchLabels: {%s: "true"}
  policyTypes: [Ingress, Egress]
`, ns, sandboxLabel))
	sleep := []string{"python3", "-c", "import time; time.sleep(86400)"}
	run(t, c, pod{name: "sandbox", namespace: ns, labels: "{" + sandboxLabel + `: "true"}`, command: sleep})
	run(t, c, pod{name: "control", namespace: ns, command: sleep})

	// The unlabelled pod reaches everything: the probes can succeed.
	for _, tg := range targets {
		waitProbe(t, c, ns, "control", tg, true)
	}
	if got := exec1(t, c, ns, "control", resolve, "kubernetes.default.svc.cluster.local"); got != c.APIServiceIP {
		t.Errorf("the unlabelled pod resolved kubernetes.default to %q; want %s", got, c.APIServiceIP)
	}
	// The sandbox reaches nothing, once kube-router has seen it (it
	// writes a pod's rules when the pod has its address: the engine must
	// not count on a sandbox being isolated the instant it runs).
	for _, tg := range targets {
		waitProbe(t, c, ns, "sandbox", tg, false)
	}
	if got := exec1(t, c, ns, "sandbox", resolve, "kubernetes.default.svc.cluster.local"); !strings.HasPrefix(got, "unresolved") {
		t.Errorf("the sandbox resolved kubernetes.default: %q", got)
	}
	// And still nothing, once isolated.
	for _, tg := range targets {
		if got := exec1(t, c, ns, "sandbox", probe, tg.args()...); got == "open" {
			t.Errorf("the sandbox reached %s (%s:%d)", tg.name, tg.host, tg.port)
		}
	}
	// Nor does anything reach the sandbox.
	sandboxIP := strings.TrimSpace(c.Kubectl(t, "get", "pod", "-n", ns, "sandbox", "-o", "jsonpath={.status.podIP}"))
	if got := exec1(t, c, ns, "control", probe, sandboxIP, "22", "", ""); got == "open" {
		t.Errorf("the unlabelled pod reached the sandbox")
	}
}

func (tg target) args() []string {
	return []string{tg.host, fmt.Sprint(tg.port), tg.send, tg.expect}
}

// waitProbe probes tg from the pod until the probe's answer is what open
// says, for up to two minutes.
func waitProbe(t *testing.T, c *testenv.Cluster, ns, name string, tg target, open bool) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		got := exec1(t, c, ns, name, probe, tg.args()...)
		if (got == "open") == open {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s reaching %s (%s:%d): %s; want open=%t", name, tg.name, tg.host, tg.port, got, open)
		}
		time.Sleep(500 * time.Millisecond)
	}
}

// exec1 runs a Python program in the pod and returns its output's first
// line.
func exec1(t *testing.T, c *testenv.Cluster, ns, name, program string, args ...string) string {
	t.Helper()
	out := c.Kubectl(t, append([]string{"exec", "-n", ns, name, "--", "python3", "-c", program}, args...)...)
	line, _, _ := strings.Cut(out, "\n")
	return strings.TrimSpace(line)
}

func atoi(t *testing.T, s string) int {
	t.Helper()
	var n int
	if _, err := fmt.Sscan(s, &n); err != nil {
		t.Fatal(err)
	}
	return n
}

// redisOn starts a redis-server that listens on the address ip (pods
// cannot reach the host's loopback) and returns its port.
func redisOn(t *testing.T, ip string) int {
	t.Helper()
	port := testenv.FreePort(t)
	cmd := exec.Command("redis-server", "--bind", ip, "--port", fmt.Sprint(port), "--protected-mode", "no",
		"--save", "", "--appendonly", "no", "--dir", t.TempDir())
	if err := cmd.Start(); err != nil {
		t.Fatalf("start redis-server: %v", err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	deadline := time.Now().Add(30 * time.Second)
	for {
		conn, err := net.Dial("tcp", net.JoinHostPort(ip, fmt.Sprint(port)))
		if err == nil {
			conn.Close()
			return port
		}
		if time.Now().After(deadline) {
			t.Fatalf("redis-server did not come up: %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// listener is a TCP server that greets whoever connects with "hello".
type listener struct {
	host string
	port int
}

// listenerOutsideCluster listens on an address of this machine that is
// neither the node's nor a pod's nor loopback — Docker's bridge, where
// Docker runs, or another lasting interface's: the nearest thing to the
// internet a test may reach.
func listenerOutsideCluster(t *testing.T, c *testenv.Cluster) listener {
	t.Helper()
	ifaces, err := net.Interfaces()
	if err != nil {
		t.Fatal(err)
	}
	// docker0 first; never the bridges and veths that containers and
	// other tests make and remove as this test runs.
	slices.SortStableFunc(ifaces, func(a, b net.Interface) int {
		return cmp.Compare(boolInt(a.Name != "docker0"), boolInt(b.Name != "docker0"))
	})
	for _, iface := range ifaces {
		if iface.Flags&net.FlagLoopback != 0 || strings.HasPrefix(iface.Name, "br-") ||
			strings.HasPrefix(iface.Name, "veth") || strings.HasPrefix(iface.Name, "runbox-") {
			continue
		}
		addrs, err := iface.Addrs()
		if err != nil {
			continue
		}
		for _, a := range addrs {
			ipnet, ok := a.(*net.IPNet)
			if !ok || ipnet.IP.To4() == nil || ipnet.IP.String() == c.NodeIP {
				continue
			}
			l, err := net.Listen("tcp", net.JoinHostPort(ipnet.IP.String(), "0"))
			if err != nil {
				continue
			}
			t.Cleanup(func() { l.Close() })
			go func() {
				for {
					conn, err := l.Accept()
					if err != nil {
						return
					}
					_, _ = io.WriteString(conn, "hello\n")
					conn.Close()
				}
			}()
			return listener{host: ipnet.IP.String(), port: l.Addr().(*net.TCPAddr).Port}
		}
	}
	t.Fatal("this machine has no IPv4 address besides the node's and loopback (Docker's bridge is one)")
	return listener{}
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

func TestServiceAndClusterDNS(t *testing.T) {
	c := testenv.Kubernetes(t)
	c.ImportImage(t, image)
	ns := namespace(t, c)
	server := `import http.server
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.end_headers()
        self.wfile.write(b"from the web pod")
http.server.HTTPServer(("", 8080), H).serve_forever()`
	run(t, c, pod{name: "web", namespace: ns, labels: "{app: web}", command: []string{"python3", "-c", server}})
	c.Apply(t, fmt.Sprintf(`apiVersion: v1
kind: Service
metadata: {name: web, namespace: %s}
spec:
  selector: {app: web}
  ports: [{port: 80, targetPort: 8080}]
`, ns))
	run(t, c, pod{name: "client", namespace: ns, command: []string{"python3", "-c", "import time; time.sleep(86400)"}})

	get := `import sys, urllib.request
try:
    print(urllib.request.urlopen(sys.argv[1], timeout=5).read().decode())
except Exception as e:
    print("failed:", type(e).__name__, e)`
	// By the Service's name, through cluster DNS and kube-proxy, to a pod
	// on the same bridge; and to itself through its own Service.
	for _, from := range []string{"client", "web"} {
		deadline := time.Now().Add(2 * time.Minute)
		for {
			got := exec1(t, c, ns, from, get, "http://web."+ns+".svc.cluster.local/")
			if got == "from the web pod" {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s fetching the web Service: %s", from, got)
			}
			time.Sleep(500 * time.Millisecond)
		}
	}
}

func TestRuntimeClassRunsc(t *testing.T) {
	c := testenv.Kubernetes(t)
	c.ImportImage(t, image)
	ns := namespace(t, c)
	// gVisor's kernel says so in the kernel log it keeps for the sandbox.
	show := `import subprocess
print(open("/proc/version").read().strip())
print(subprocess.run(["dmesg"], capture_output=True, text=True).stdout)`
	agent := `import os, sys
for line in sys.stdin:
    print(os.getuid(), line.strip()[::-1], flush=True)`
	run(t, c, pod{name: "gvisor", namespace: ns, runtimeClass: "runsc", stdin: true,
		command: []string{"python3", "-u", "-c", agent}})
	out := c.Kubectl(t, "exec", "-n", ns, "gvisor", "--", "python3", "-c", show)
	if !strings.Contains(out, "gVisor") {
		t.Fatalf("the runsc pod does not run under gVisor:\n%s", out)
	}
	if got := attach(t, c, ns, "gvisor", "hello"); got != "1000 olleh" {
		t.Fatalf("the agent under gVisor answered %q; want %q", got, "1000 olleh")
	}
	// The runtime runs gVisor without a network stack (network=none, as
	// deploy/runsc.sh registers it with Docker): with no NetworkPolicy at
	// all, the pod reaches nothing.
	if got := exec1(t, c, ns, "gvisor", probe, c.APIServiceIP, "443", "", ""); got == "open" {
		t.Errorf("the gVisor pod reached the API server's Service")
	}
}
