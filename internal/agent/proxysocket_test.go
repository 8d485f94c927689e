package agent

import (
	"net"
	"path/filepath"
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
		pc, err := dialProxySocket(path, 7)
		if err != nil {
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
