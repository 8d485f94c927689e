package kubernetes

import (
	"cmp"
	"fmt"
	"io"
	"net"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/runbox-dev/runbox/internal/testenv"
)

// probes is a Python program that tries each host:port of its
// environment's PROBES (space-separated) and prints "host:port open" or
// "host:port closed" for each; to each host:port of UDP_PROBES it sends
// datagrams naming it (a send succeeds whether or not a policy drops the
// datagram: the listener tells).
const probes = `import os, socket
for t in os.environ["PROBES"].split():
    h, p = t.rsplit(":", 1)
    try:
        socket.create_connection((h, int(p)), timeout=1).close()
        print(t, "open")
    except Exception:
        print(t, "closed")
for t in os.environ.get("UDP_PROBES", "").split():
    h, p = t.rsplit(":", 1)
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    for _ in range(5):
        try:
            s.sendto(t.encode(), (h, int(p)))
        except OSError:
            pass`

// denyAll is deploy/kubernetes's policy for the sandboxes' namespace.
const denyAll = `apiVersion: networking.k8s.io/v1
kind: NetworkPolicy
metadata: {name: sandboxes-deny-all, namespace: %s}
spec:
  podSelector: {}
  policyTypes: [Ingress, Egress]
`

// TestSandboxIsIsolatedFromItsFirstRun: under deploy/kubernetes's
// NetworkPolicy, a sandbox's very first program reaches neither the API
// server (its Service, the node), nor Redis on the node, nor an address
// outside the cluster, when the engine awaits its isolation; the same
// targets are reachable from a pod the policy does not cover.
func TestSandboxIsIsolatedFromItsFirstRun(t *testing.T) {
	c := testCluster(t)
	_, apiPort, _ := net.SplitHostPort(strings.TrimPrefix(c.API, "https://"))
	outside := listenOutside(t, c.NodeIP)
	targets := []string{
		net.JoinHostPort(c.APIServiceIP, "443"),
		net.JoinHostPort(c.NodeIP, apiPort),
		net.JoinHostPort(c.NodeIP, fmt.Sprint(redisOn(t, c.NodeIP))),
		outside,
	}
	udp := listenUDP(t, c.NodeIP)
	ns := c.namespace(t)
	c.Apply(t, fmt.Sprintf(denyAll, ns))
	e := c.engineWith(t, Settings{Namespace: ns, PullPolicy: corev1.PullNever, Isolated: net.JoinHostPort(c.APIServiceIP, "443")})
	env := map[string]string{"PROBES": strings.Join(targets, " "), "UDP_PROBES": udp.addr}

	spec := c.spec(nil)
	spec.Env = env
	conn, _ := start(t, e, spec)
	out, _ := run(t, conn, probes)
	for _, tg := range targets {
		if !strings.Contains(out, tg+" closed") {
			t.Errorf("the sandbox's first run reached %s:\n%s", tg, out)
		}
	}
	if udp.received(time.Second) {
		t.Errorf("the sandbox's datagrams reached %s on the node", udp.addr)
	}

	// The control: the same image and program in a namespace with no
	// policy reaches them all (so "closed" above is the policy's doing).
	free := c.engine(t)
	spec = c.spec(nil)
	spec.Env = env
	conn, _ = start(t, free, spec)
	out, _ = run(t, conn, probes)
	if !udp.received(5 * time.Second) {
		t.Errorf("a sandbox with no policy did not reach %s by UDP", udp.addr)
	}
	for _, tg := range targets {
		if !strings.Contains(out, tg+" open") {
			t.Errorf("a sandbox with no policy did not reach %s:\n%s", tg, out)
		}
	}
}

// redisOn starts a redis-server on the address ip (pods cannot reach
// the host's loopback) and returns its port.
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

// listenOutside listens on an address of this machine that is neither
// the node's nor loopback (Docker's bridge first), the nearest thing to
// the internet a test reaches, and returns it.
func listenOutside(t *testing.T, nodeIP string) string {
	t.Helper()
	ifaces, err := net.Interfaces()
	if err != nil {
		t.Fatal(err)
	}
	notDocker := func(i net.Interface) int {
		if i.Name == "docker0" {
			return 0
		}
		return 1
	}
	slices.SortStableFunc(ifaces, func(a, b net.Interface) int { return cmp.Compare(notDocker(a), notDocker(b)) })
	for _, iface := range ifaces {
		if iface.Flags&net.FlagLoopback != 0 || strings.HasPrefix(iface.Name, "br-") ||
			strings.HasPrefix(iface.Name, "veth") || strings.HasPrefix(iface.Name, "runbox-") || strings.HasPrefix(iface.Name, "cni") {
			continue
		}
		addrs, _ := iface.Addrs()
		for _, a := range addrs {
			ipnet, ok := a.(*net.IPNet)
			if !ok || ipnet.IP.To4() == nil || ipnet.IP.String() == nodeIP {
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
			return l.Addr().String()
		}
	}
	t.Fatal("this machine has no IPv4 address besides the node's and loopback")
	return ""
}

// udpListener counts the datagrams that reach an address of the node.
type udpListener struct {
	addr string
	got  chan struct{}
}

// listenUDP listens for datagrams on the node's address ip (what a pod
// reaches of the host, were it not for the policy).
func listenUDP(t *testing.T, ip string) *udpListener {
	t.Helper()
	pc, err := net.ListenPacket("udp4", net.JoinHostPort(ip, "0"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { pc.Close() })
	l := &udpListener{addr: pc.LocalAddr().String(), got: make(chan struct{}, 64)}
	go func() {
		buf := make([]byte, 512)
		for {
			if _, _, err := pc.ReadFrom(buf); err != nil {
				return
			}
			select {
			case l.got <- struct{}{}:
			default:
			}
		}
	}()
	return l
}

// received reports whether a datagram came, waiting at most wait for one.
func (l *udpListener) received(wait time.Duration) bool {
	select {
	case <-l.got:
		return true
	case <-time.After(wait):
		return false
	}
}
