package agent

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/runbox-dev/runbox/internal/testenv"
)

// echoServer listens on addr ("127.0.0.1:0", "[::1]:0") and echoes what
// each connection sends; it returns the port.
func echoServer(t *testing.T, addr string) int {
	t.Helper()
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				io.Copy(c, c)
			}()
		}
	}()
	return ln.Addr().(*net.TCPAddr).Port
}

// deafServer listens on the IPv4 loopback and hands over the first
// connection it takes, which it never reads; it returns the port.
func deafServer(t *testing.T) (int, <-chan net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	held := make(chan net.Conn, 1)
	go func() {
		if conn, err := ln.Accept(); err == nil {
			held <- conn
		}
	}()
	return ln.Addr().(*net.TCPAddr).Port, held
}

func ctxFor(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func TestStreamsDialAndListening(t *testing.T) {
	c := startAgent(t)
	ctx := ctxFor(t)
	v4 := echoServer(t, "127.0.0.1:0")
	v6 := echoServer(t, "[::1]:0")
	nobody := testenv.FreePort(t)
	for _, tt := range []struct {
		name string
		port int
		want bool
	}{
		{"IPv4 listener", v4, true},
		{"IPv6 listener", v6, true},
		{"nothing listens", nobody, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			yes, err := c.Listening(ctx, tt.port)
			if err != nil || yes != tt.want {
				t.Fatalf("Listening = %v, %v; want %v", yes, err, tt.want)
			}
			s, err := c.Dial(ctx, tt.port)
			if !tt.want {
				if !errors.Is(err, ErrNotListening) {
					t.Fatalf("Dial = %v, want ErrNotListening", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			defer s.Close()
			testenv.EchoBack(t, s, 64)
		})
	}
	for _, port := range []int{0, -1, 65536} {
		if _, err := c.Dial(ctx, port); err == nil || errors.Is(err, ErrNotListening) {
			t.Errorf("Dial(%d) = %v, want a range error", port, err)
		}
	}
}

func TestStreamsManyAtOnce(t *testing.T) {
	c := startAgent(t)
	ctx := ctxFor(t)
	port := echoServer(t, "127.0.0.1:0")
	var wg sync.WaitGroup
	for range 100 {
		wg.Go(func() {
			s, err := c.Dial(ctx, port)
			if err != nil {
				t.Error(err)
				return
			}
			defer s.Close()
			testenv.EchoBack(t, s, 64<<10)
		})
	}
	wg.Wait()
}

func TestStreamsLargeBothWays(t *testing.T) {
	c := startAgent(t)
	s, err := c.Dial(ctxFor(t), echoServer(t, "127.0.0.1:0"))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	testenv.EchoBack(t, s, 32<<20)
}

// A stream nobody reads, and one whose far end reads nothing, hold up
// neither the program's output nor other streams.
func TestStreamsStalledReaderDoesNotStallOutput(t *testing.T) {
	c := startAgent(t)
	ctx := ctxFor(t)
	// A server that sends without end, and one that never reads.
	flood, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer flood.Close()
	go func() {
		for {
			conn, err := flood.Accept()
			if err != nil {
				return
			}
			go func() {
				chunk := make([]byte, 64<<10)
				for {
					if _, err := conn.Write(chunk); err != nil {
						return
					}
				}
			}()
		}
	}()
	deaf, held := deafServer(t)
	unread, err := c.Dial(ctx, flood.Addr().(*net.TCPAddr).Port)
	if err != nil {
		t.Fatal(err)
	}
	defer unread.Close()
	unwritten, err := c.Dial(ctx, deaf)
	if err != nil {
		t.Fatal(err)
	}
	defer unwritten.Close()
	go func() {
		chunk := make([]byte, 64<<10)
		for {
			if _, err := unwritten.Write(chunk); err != nil {
				return
			}
		}
	}()
	time.Sleep(200 * time.Millisecond) // both windows full

	if err := c.Start(Run{Code: "for i in $(seq 1 200); do echo line $i; done"}); err != nil {
		t.Fatal(err)
	}
	c.CloseStdin()
	o := collect(t, c)
	if !strings.HasSuffix(o.stdout, "line 200\n") || o.exit.ExitCode != 0 {
		t.Fatalf("output behind stalled streams: %q, exit %+v", o.stdout[max(0, len(o.stdout)-40):], o.exit)
	}
	// Another stream still goes through.
	s, err := c.Dial(ctx, echoServer(t, "127.0.0.1:0"))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	testenv.EchoBack(t, s, 16)
	select {
	case conn := <-held:
		conn.Close()
	default:
	}
}

// Connections to the proxy listener reach the executor, through its proxy
// socket where it has one, else as proxy streams, carrying the number of
// the run they were made in.
func TestStreamsProxyCarriesTheRun(t *testing.T) {
	for _, tc := range []struct {
		name   string
		socket bool
	}{{"stream", false}, {"socket", true}} {
		t.Run(tc.name, func(t *testing.T) { testProxyCarriesTheRun(t, tc.socket) })
	}
}

func testProxyCarriesTheRun(t *testing.T, socket bool) {
	port := testenv.FreePort(t)
	type inbound struct {
		run    uint32
		data   string
		socket bool
	}
	got := make(chan inbound, 4)
	c := startAgentConfig(t, func(cfg *Config) {
		cfg.Proxy = fmt.Sprintf("127.0.0.1:%d", port)
		if socket {
			cfg.ProxySocket = filepath.Join(t.TempDir(), "proxy.sock")
		}
	}, func(conn net.Conn, run uint32) {
		defer conn.Close()
		b, _ := io.ReadAll(io.LimitReader(conn, 64))
		conn.Write([]byte("answer"))
		sc, viaSocket := conn.(*socketConn)
		if viaSocket {
			// Where the socket carries descriptors, the program's own
			// connection is passed, not copied.
			if _, passed := sc.Conn.(*net.TCPConn); !passed {
				t.Errorf("run %d: the connection was copied, not passed", run)
			}
		}
		got <- inbound{run, string(b), viaSocket}
	})
	// As a program would, in the first run and then in the second.
	for run := uint32(1); run <= 2; run++ {
		code := fmt.Sprintf("exec 3<>/dev/tcp/127.0.0.1/%d; printf 'hello %d' >&3; exec 3>&-", port, run)
		if run == 2 {
			code = fmt.Sprintf("exec 3<>/dev/tcp/127.0.0.1/%d; printf 'hello %d' >&3; sleep 0.2", port, run)
		}
		if err := c.Start(Run{Code: code}); err != nil {
			t.Fatal(err)
		}
		c.CloseStdin()
		if o := collect(t, c); o.exit.ExitCode != 0 {
			t.Fatalf("run %d: %+v", run, o)
		}
		select {
		case in := <-got:
			if in.run != run || in.data != fmt.Sprintf("hello %d", run) || in.socket != socket {
				t.Errorf("run %d: got run %d, %q, through the socket %v", run, in.run, in.data, in.socket)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("run %d: no proxy connection", run)
		}
	}
	if c.NextRun() != 3 {
		t.Errorf("NextRun = %d, want 3", c.NextRun())
	}
	// The listener is the agent's: it is neither dialled nor reported.
	ctx := ctxFor(t)
	if _, err := c.Dial(ctx, port); !errors.Is(err, ErrNotListening) {
		t.Errorf("Dial of the proxy port: %v, want ErrNotListening", err)
	}
	if yes, err := c.Listening(ctx, port); yes || err != nil {
		t.Errorf("Listening on the proxy port = %v, %v", yes, err)
	}
}

// The executor's end of a stream to a port ends the connection to the
// server, even a server that never reads: the stream leaves the
// executor's session, and the server's writes fail.
func TestStreamsEndWithTheExecutors(t *testing.T) {
	c := startAgent(t)
	deaf, held := deafServer(t)
	s, err := c.Dial(ctxFor(t), deaf)
	if err != nil {
		t.Fatal(err)
	}
	var conn net.Conn
	select {
	case conn = <-held:
		defer conn.Close()
	case <-time.After(10 * time.Second):
		t.Fatal("the server got no connection")
	}
	s.Close()
	deadline := time.Now().Add(10 * time.Second)
	for c.mux.session().NumStreams() > 0 {
		if time.Now().After(deadline) {
			t.Fatal("the stream stayed in the executor's session: the agent held the server's connection")
		}
		time.Sleep(10 * time.Millisecond)
	}
	// The first write after the agent closed may be taken; the peer's
	// reset fails the next ones.
	for {
		if _, err := conn.Write([]byte("push")); err != nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the server's writes still go through")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// A reset ends every stream, and the next conversation gets a session of
// its own.
func TestStreamsEndAtReset(t *testing.T) {
	c := startAgent(t)
	ctx := ctxFor(t)
	port := echoServer(t, "127.0.0.1:0")
	s, err := c.Dial(ctx, port)
	if err != nil {
		t.Fatal(err)
	}
	testenv.EchoBack(t, s, 16)
	if err := c.Reset(); err != nil {
		t.Fatal(err)
	}
	m, err := c.Recv()
	if err != nil || m.Kind != ResetDone {
		t.Fatalf("got %+v %v, want the reset's answer", m, err)
	}
	s.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := s.Write([]byte("after")); err == nil {
		if n, err := s.Read(make([]byte, 8)); err == nil {
			t.Fatalf("a stream of before the reset still carries %d bytes", n)
		}
	}
	s2, err := c.Dial(ctx, port)
	if err != nil {
		t.Fatal(err)
	}
	defer s2.Close()
	testenv.EchoBack(t, s2, 16)
}

func TestReadStreamHeader(t *testing.T) {
	for _, tt := range []struct {
		name string
		in   []byte
		want streamHeader
		ok   bool
	}{
		{"dial", []byte{streamDial, 0x1f, 0x90}, streamHeader{kind: streamDial, port: 8080}, true},
		{"listening", []byte{streamListening, 0, 80}, streamHeader{kind: streamListening, port: 80}, true},
		{"proxy", []byte{streamProxy, 0, 0, 1, 2}, streamHeader{kind: streamProxy, run: 258}, true},
		{"port zero", []byte{streamDial, 0, 0}, streamHeader{}, false},
		{"unknown kind", []byte{'X', 0, 80}, streamHeader{}, false},
		{"short", []byte{streamProxy, 0, 0}, streamHeader{}, false},
		{"empty", nil, streamHeader{}, false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			h, err := readStreamHeader(bytes.NewReader(tt.in))
			if (err == nil) != tt.ok || h != tt.want {
				t.Fatalf("got %+v, %v; want %+v (ok %v)", h, err, tt.want, tt.ok)
			}
		})
	}
}

func FuzzReadStreamHeader(f *testing.F) {
	f.Add([]byte{streamDial, 0x1f, 0x90})
	f.Add([]byte{streamProxy, 0, 0, 0, 7, 'x'})
	f.Add([]byte{streamListening, 0})
	f.Fuzz(func(t *testing.T, data []byte) {
		h, err := readStreamHeader(bytes.NewReader(data))
		if err != nil {
			return
		}
		enc := h.encode()
		if !bytes.HasPrefix(data, enc) {
			t.Fatalf("header %+v encodes as %x, read from %x", h, enc, data)
		}
		if h.kind != streamProxy && h.port == 0 {
			t.Fatalf("port 0 accepted: %+v", h)
		}
	})
}
