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
