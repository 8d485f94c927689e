package agent

import (
	"io"
	"net"
	"path/filepath"
	"syscall"
	"testing"
	"time"
)

// A reset closes every connection the proxy socket took and its listener,
// which drops those not yet taken: none made in one conversation is
// served in the next. ResumeProxy listens again; Close for good.
func TestProxySocketAtReset(t *testing.T) {
	path := filepath.Join(t.TempDir(), "proxy.sock")
	taken := make(chan net.Conn, 4)
	c := startAgentConfig(t, func(cfg *Config) { cfg.ProxySocket = path },
		func(conn net.Conn, run uint32) { taken <- conn })
	take := func() net.Conn {
		t.Helper()
		// As a program could, bypassing the agent's listener.
		pc, err := dialProxySocket(path)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := pc.Write(streamHeader{kind: streamProxy, run: 7}.encode()); err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { pc.Close() })
		select {
		case <-taken:
		case <-time.After(5 * time.Second):
			t.Fatal("the socket's connection was not handed on")
		}
		return pc
	}
	held := take()

	if err := c.Reset(); err != nil {
		t.Fatal(err)
	}
	if m, err := c.Recv(); err != nil || m.Kind != ResetDone {
		t.Fatalf("got %+v %v, want the reset's answer", m, err)
	}
	held.SetReadDeadline(time.Now().Add(5 * time.Second))
	if n, err := held.Read(make([]byte, 1)); err == nil {
		t.Fatalf("a connection of before the reset is open (read %d bytes)", n)
	} else if ne, ok := err.(net.Error); ok && ne.Timeout() {
		t.Fatal("a connection of before the reset is open")
	}
	if pc, err := net.Dial("unix", path); err == nil {
		pc.Close()
		t.Fatal("the socket listens between a reset and ResumeProxy")
	}

	if err := c.ResumeProxy(); err != nil {
		t.Fatal(err)
	}
	take()

	c.Close()
	if err := c.ResumeProxy(); err != nil {
		t.Fatal(err)
	}
	if pc, err := net.Dial("unix", path); err == nil {
		pc.Close()
		t.Fatal("the socket listens after Close")
	}
}

// A path too long for a Unix socket is refused, not cut.
func TestProxySocketPathTooLong(t *testing.T) {
	c := NewConn(nil, nil)
	long := "/" + string(make([]byte, MaxSocketPath))
	if err := c.ListenProxy(long); err == nil {
		t.Fatal("ListenProxy took a path too long")
	}
}

// A sandbox holds at most maxSocketConns connections to its proxy socket
// open: past it, one is closed as it is accepted, however many its
// processes open.
func TestProxySocketBounded(t *testing.T) {
	path := filepath.Join(t.TempDir(), "proxy.sock")
	c := NewConn(nil, nil)
	c.OnProxy(func(conn net.Conn, run uint32) { conn.Close() })
	if err := c.ListenProxy(path); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	// Held open without a header, each waits for one.
	for range maxSocketConns {
		pc, err := net.Dial("unix", path)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { pc.Close() })
	}
	waitFor := func(ok func() bool) bool {
		for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
			if ok() {
				return true
			}
		}
		return false
	}
	if !waitFor(func() bool {
		c.sock.mu.Lock()
		defer c.sock.mu.Unlock()
		return len(c.sock.conns) == maxSocketConns
	}) {
		t.Fatal("the connections were not all taken")
	}
	over, err := net.Dial("unix", path)
	if err != nil {
		t.Fatal(err)
	}
	defer over.Close()
	over.SetReadDeadline(time.Now().Add(headerTimeout / 2))
	if _, err := over.Read(make([]byte, 1)); err == nil {
		t.Fatal("read from a connection past the bound")
	} else if ne, ok := err.(net.Error); ok && ne.Timeout() {
		t.Fatal("a connection past the bound is held open")
	}
}

// What arrives on the proxy socket is the sandbox's to forge: a passed
// descriptor is served only if it is one TCP connection sent with its
// header; anything else closes the connection and every descriptor sent.
func TestProxySocketPassedDescriptors(t *testing.T) {
	tcpPair := func(t *testing.T) (*net.TCPConn, *net.TCPConn) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		a, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		b, err := ln.Accept()
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { a.Close(); b.Close() })
		return a.(*net.TCPConn), b.(*net.TCPConn)
	}
	// fdOf moves c into a descriptor of its own, which the test closes
	// once it is sent.
	fdOf := func(t *testing.T, c *net.TCPConn) int {
		f, err := c.File()
		if err != nil {
			t.Fatal(err)
		}
		defer f.Close()
		c.Close()
		fd, err := syscall.Dup(int(f.Fd()))
		if err != nil {
			t.Fatal(err)
		}
		return fd
	}
	passed := streamHeader{kind: streamPassed, run: 3}.encode()
	proxy := streamHeader{kind: streamProxy, run: 3}.encode()
	for _, tc := range []struct {
		name string
		// send returns the header and descriptors to send, and the peer
		// of a TCP connection among them, if any.
		send func(t *testing.T) ([]byte, []int, net.Conn)
		// served: the connection handed on is the passed one (TCP), the
		// socket's own (copied), or none.
		served string
	}{
		{"one TCP connection", func(t *testing.T) ([]byte, []int, net.Conn) {
			a, b := tcpPair(t)
			return passed, []int{fdOf(t, b)}, a
		}, "passed"},
		{"a header without a descriptor", func(t *testing.T) ([]byte, []int, net.Conn) {
			return passed, nil, nil
		}, "none"},
		{"a half header with one", func(t *testing.T) ([]byte, []int, net.Conn) {
			a, b := tcpPair(t)
			return passed[:3], []int{fdOf(t, b)}, a
		}, "none"},
		{"two TCP connections", func(t *testing.T) ([]byte, []int, net.Conn) {
			a, b := tcpPair(t)
			_, d := tcpPair(t)
			return passed, []int{fdOf(t, b), fdOf(t, d)}, a
		}, "none"},
		{"a pipe", func(t *testing.T) ([]byte, []int, net.Conn) {
			var p [2]int
			if err := syscall.Pipe(p[:]); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { syscall.Close(p[1]) })
			return passed, []int{p[0]}, nil
		}, "none"},
		{"a Unix socket", func(t *testing.T) ([]byte, []int, net.Conn) {
			fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_STREAM, 0)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { syscall.Close(fds[1]) })
			return passed, []int{fds[0]}, nil
		}, "none"},
		{"a copied connection's header with a descriptor", func(t *testing.T) ([]byte, []int, net.Conn) {
			a, b := tcpPair(t)
			return proxy, []int{fdOf(t, b)}, a
		}, "copied"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "proxy.sock")
			taken := make(chan net.Conn, 1)
			c := NewConn(nil, nil)
			c.OnProxy(func(conn net.Conn, run uint32) {
				if run != 3 {
					t.Errorf("run %d, want 3", run)
				}
				taken <- conn
			})
			if err := c.ListenProxy(path); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(c.Close)
			uc, err := dialProxySocket(path)
			if err != nil {
				t.Fatal(err)
			}
			defer uc.Close()
			header, fds, peer := tc.send(t)
			var oob []byte
			if len(fds) > 0 {
				oob = syscall.UnixRights(fds...)
			}
			if _, _, err := uc.WriteMsgUnix(header, oob, nil); err != nil {
				t.Fatal(err)
			}
			// The test's own copies of what it sent: only the socket's
			// hold them now.
			for _, fd := range fds {
				syscall.Close(fd)
			}
			// Either handed on, or the socket's connection is closed.
			ended := make(chan struct{})
			go func() {
				defer close(ended)
				_, _ = uc.Read(make([]byte, 1))
			}()
			var got net.Conn
			select {
			case got = <-taken:
			case <-ended:
				// A passed connection is handed on just after the
				// socket's own is closed.
				select {
				case got = <-taken:
				case <-time.After(time.Second):
				}
			case <-time.After(headerTimeout / 2):
				t.Fatal("neither served nor closed")
			}
			if got != nil {
				defer got.Close()
			}
			kind := "none"
			if got != nil {
				kind = "copied"
				if _, ok := got.(*socketConn).Conn.(*net.TCPConn); ok {
					kind = "passed"
				}
			}
			if kind != tc.served {
				t.Fatalf("served %s, want %s", kind, tc.served)
			}
			if kind == "passed" {
				// The proxy speaks to the program's connection itself.
				if _, err := got.Write([]byte("hi")); err != nil {
					t.Fatal(err)
				}
				buf := make([]byte, 2)
				peer.SetReadDeadline(time.Now().Add(5 * time.Second))
				if _, err := io.ReadFull(peer, buf); err != nil || string(buf) != "hi" {
					t.Fatalf("read %q, %v", buf, err)
				}
				return
			}
			if peer != nil {
				// Whatever was passed is closed: its peer reads the end.
				peer.SetReadDeadline(time.Now().Add(5 * time.Second))
				if n, err := peer.Read(make([]byte, 1)); err == nil {
					t.Fatalf("read %d bytes from a connection passed in vain", n)
				} else if ne, ok := err.(net.Error); ok && ne.Timeout() {
					t.Fatal("a connection passed in vain is held open")
				}
			}
		})
	}
}
