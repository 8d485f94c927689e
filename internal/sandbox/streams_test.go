package sandbox

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/runbox-dev/runbox/internal/testenv"
)

// servers is a Python program serving, inside its sandbox: GET /N answers
// N bytes on 8000 (IPv4) and 8002 (IPv6 only); 8003 echoes; 8004 sends
// without end to whoever connects. It prints a tick every 20 ms meanwhile.
const servers = `import http.server, socket, socketserver, threading, time
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = b"x" * int(self.path[1:] or 5)
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a):
        pass
class V6(http.server.ThreadingHTTPServer):
    address_family = socket.AF_INET6
class Echo(socketserver.BaseRequestHandler):
    def handle(self):
        while True:
            b = self.request.recv(1 << 16)
            if not b:
                break
            self.request.sendall(b)
class Flood(socketserver.BaseRequestHandler):
    def handle(self):
        chunk = b"f" * (1 << 16)
        while True:
            self.request.sendall(chunk)
socketserver.ThreadingTCPServer.allow_reuse_address = True
for srv in (http.server.ThreadingHTTPServer(("127.0.0.1", 8000), H), V6(("::1", 8002), H),
            socketserver.ThreadingTCPServer(("127.0.0.1", 8003), Echo),
            socketserver.ThreadingTCPServer(("127.0.0.1", 8004), Flood)):
    srv.daemon_threads = True
    threading.Thread(target=srv.serve_forever, daemon=True).start()
i = 0
while True:
    print("tick", i, flush=True)
    i += 1
    time.sleep(0.02)
`

// background runs code in conversation conv until the test ends, and
// waits until something listens on port.
func background(t *testing.T, m *Manager, conv, code string, port int, out Output) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		m.Run(ctx, Request{RunID: "bg-" + conv, ConversationID: conv, Language: "python", Code: code,
			Timeout: 5 * time.Minute, DataDir: dataDir(t)}, out)
	}()
	t.Cleanup(func() { cancel(); <-done })
	deadline := time.Now().Add(60 * time.Second)
	for {
		if yes, _ := m.Listening(ctx, conv, port); yes {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("nothing listens on %d in %s", port, conv)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// httpVia is an HTTP client whose every connection goes to port in conv.
func httpVia(m *Manager, conv string, port int) *http.Client {
	return &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{
		DisableKeepAlives: true,
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			return m.DialPort(ctx, conv, port)
		},
	}}
}

func getN(t *testing.T, c *http.Client, n int) {
	t.Helper()
	resp, err := c.Get(fmt.Sprintf("http://sandbox/%d", n))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != 200 || len(b) != n {
		t.Fatalf("GET: %d, %d bytes, %v", resp.StatusCode, len(b), err)
	}
}

func TestDialPort(t *testing.T) {
	m, _ := newManager(t, defaultLimits)
	var out capture
	background(t, m, "web", servers, 8004, out.output)
	ctx := context.Background()

	t.Run("a port a program listens on", func(t *testing.T) {
		getN(t, httpVia(m, "web", 8000), 5)
		getN(t, httpVia(m, "web", 8002), 7) // IPv6 only
	})

	t.Run("not listening", func(t *testing.T) {
		for _, tt := range []struct {
			conv string
			port int
		}{{"web", 8001}, {"elsewhere", 8000}, {"", 8000}} {
			if _, err := m.DialPort(ctx, tt.conv, tt.port); !errors.Is(err, ErrNotListening) {
				t.Errorf("DialPort(%q, %d) = %v, want ErrNotListening", tt.conv, tt.port, err)
			}
			if yes, err := m.Listening(ctx, tt.conv, tt.port); yes || err != nil {
				t.Errorf("Listening(%q, %d) = %v, %v", tt.conv, tt.port, yes, err)
			}
		}
		if _, err := m.DialPort(ctx, "web", 70000); err == nil || errors.Is(err, ErrNotListening) {
			t.Errorf("port 70000: %v", err)
		}
	})

	t.Run("many streams at once", func(t *testing.T) {
		c := httpVia(m, "web", 8000)
		var wg sync.WaitGroup
		for i := range 50 {
			wg.Go(func() { getN(t, c, 1000+i) })
		}
		wg.Wait()
	})

	t.Run("large transfer both ways", func(t *testing.T) {
		s, err := m.DialPort(ctx, "web", 8003)
		if err != nil {
			t.Fatal(err)
		}
		defer s.Close()
		testenv.EchoBack(t, s, 16<<20)
		// A large download too.
		getN(t, httpVia(m, "web", 8000), 8<<20)
	})

	t.Run("a stalled reader does not stall output", func(t *testing.T) {
		for range 4 { // streams nobody reads, their windows full
			s, err := m.DialPort(ctx, "web", 8004)
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
		}
		time.Sleep(200 * time.Millisecond)
		out.mu.Lock()
		before := len(out.chunks)
		out.mu.Unlock()
		deadline := time.Now().Add(30 * time.Second)
		for {
			out.mu.Lock()
			n := len(out.chunks)
			out.mu.Unlock()
			if n >= before+25 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("output stalled behind unread streams: %d ticks after %d", n-before, before)
			}
			time.Sleep(20 * time.Millisecond)
		}
		getN(t, httpVia(m, "web", 8000), 5) // and other streams still move
	})
}

// TestDialPortWarmAndReset: a kept interpreter's server outlives its cell,
// so the idle sandbox is dialled; recycling it ends the stream and the
// conversation has no sandbox to dial.
func TestDialPortWarmAndReset(t *testing.T) {
	m := newManagerWith(t, func(o *Options) {
		o.MaxPool = WarmLimits{Default: 2}
		o.Recycle = func(string, func(string) bool, time.Time) (string, error) { return dataDir(t), nil }
	})
	dir := dataDir(t)
	var c capture
	cell := servers[:strings.Index(servers, "i = 0")]
	if oc, err := m.Run(context.Background(), Request{RunID: "cell", ConversationID: "kept", Language: "python",
		Code: cell, KeepState: true, Timeout: time.Minute, DataDir: dir}, c.output); err != nil || oc.ExitCode != 0 {
		t.Fatalf("cell: %+v %v %s", oc, err, c.stderr.String())
	}
	ctx := context.Background()
	if m.Warm() != 1 {
		t.Fatalf("%d warm sandboxes", m.Warm())
	}
	getN(t, httpVia(m, "kept", 8000), 11)
	s, err := m.DialPort(ctx, "kept", 8003)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	testenv.EchoBack(t, s, 16)
	m.evict(func(*sandbox) bool { return true }, m.recycle)
	if m.Pooled("python") != 1 {
		t.Fatalf("the sandbox was not recycled (%d pooled)", m.Pooled("python"))
	}
	s.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := s.Read(make([]byte, 1)); err == nil {
		t.Error("a stream outlived the reset")
	}
	if _, err := m.DialPort(ctx, "kept", 8000); !errors.Is(err, ErrNotListening) {
		t.Errorf("DialPort after recycling: %v", err)
	}
}

// TestInbound: connections a program makes to the proxy listener reach
// Options.Inbound with the run it was running.
func TestInbound(t *testing.T) {
	got := make(chan Inbound, 4)
	m := newManagerWith(t, func(o *Options) {
		o.Inbound = func(in Inbound) {
			go func() {
				defer in.Conn.Close()
				b := make([]byte, 2)
				io.ReadFull(in.Conn, b)
				in.Conn.Write([]byte("answer to " + string(b)))
				got <- in
			}()
		}
	})
	dir := dataDir(t)
	code := `import socket
s = socket.create_connection(("127.0.0.1", 3128))
s.sendall(b"hi")
print(s.recv(100).decode())`
	for _, run := range []string{"run-1", "run-2"} {
		var c capture
		oc, err := m.Run(context.Background(), Request{RunID: run, ConversationID: "in", Language: "python", Code: code,
			Timeout: time.Minute, DataDir: dir}, c.output)
		if err != nil || oc.ExitCode != 0 || c.stdout.String() != "answer to hi\n" {
			t.Fatalf("%s: %+v %v %q %q", run, oc, err, c.stdout.String(), c.stderr.String())
		}
		in := <-got
		if in.RunID != run || in.Conversation != "in" {
			t.Errorf("inbound of %s: %+v", run, in)
		}
	}
}
