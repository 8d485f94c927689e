package agent

import (
	"errors"
	"fmt"
	"log"
	"net"
	"os"
	"sync"
	"time"
)

// The proxy socket is the fast way out of a sandbox for its programs'
// proxy connections: a Unix socket the executor listens on, in a folder
// of the host mounted into the sandbox (ProxySocket). A connection taken
// by the agent's proxy listener is carried over a connection to it,
// which starts with the same header as a proxy stream (the agent's run
// number), so that its bytes cross one socket pair in each direction
// instead of the protocol's frames through the Docker Engine. Where the
// executor mounted none (a Docker Engine on another host), or it cannot
// be reached (gVisor without --host-uds=open), connections go as streams.
//
// A program can reach the socket as well as the agent can: what it sends
// there is no more trusted than what it sends to the proxy listener. The
// run number it could forge is checked against the run the sandbox runs
// (as for a stream), and a reset closes the socket's connections, drops
// those not yet taken with the listener, and listens anew, so that none
// made in one conversation is served in the next.

// ProxySocket is where the agent finds the executor's proxy socket.
const ProxySocket = "/run/runbox/proxy.sock"

// socketBuffer is the proxy socket's buffer towards the sandbox.
const socketBuffer = 1 << 20

// maxSocketConns bounds the connections a sandbox's proxy socket holds
// open at once: each costs the executor a descriptor, and a sandbox's
// processes together could otherwise open enough to exhaust the
// executor's, every other sandbox's egress with them. Past it, a
// connection is closed as it is accepted.
const maxSocketConns = 1024

// MaxSocketPath bounds the length of a Unix socket's path (sun_path).
const MaxSocketPath = 107

// dialProxySocket connects to the executor's proxy socket at path, for a
// connection of run.
func dialProxySocket(path string, run uint32) (net.Conn, error) {
	c, err := net.DialTimeout("unix", path, dialTimeout)
	if err != nil {
		return nil, err
	}
	if uc, ok := c.(*net.UnixConn); ok {
		_ = uc.SetReadBuffer(socketBuffer)
	}
	if _, err := c.Write(streamHeader{kind: streamProxy, run: run}.encode()); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

// proxySocket is the executor's end: a listener and the connections it
// took, until a reset or the end.
type proxySocket struct {
	path  string
	proxy func(net.Conn, uint32)

	mu    sync.Mutex
	ln    net.Listener // nil between a reset and its end, and after close
	conns map[*socketConn]struct{}
	done  bool
}

// ListenProxy listens on a proxy socket at path (in a folder mounted into
// the sandbox at ProxySocket's), whose connections go where OnProxy says.
// Call it after OnProxy, before Hello.
func (c *Conn) ListenProxy(path string) error {
	if len(path) > MaxSocketPath {
		return fmt.Errorf("agent: proxy socket path longer than %d bytes", MaxSocketPath)
	}
	s := &proxySocket{path: path, proxy: c.proxy, conns: map[*socketConn]struct{}{}}
	if err := s.listen(); err != nil {
		return err
	}
	c.sock = s
	return nil
}

// listen starts a listener, for the sandbox's user whoever that is: the
// folder it is in is the sandbox's alone.
func (s *proxySocket) listen() error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.done || s.ln != nil {
		return nil
	}
	_ = os.Remove(s.path) // left by the listener before a reset
	ln, err := net.Listen("unix", s.path)
	if err != nil {
		return fmt.Errorf("agent: proxy socket: %w", err)
	}
	if err := os.Chmod(s.path, 0o666); err != nil {
		ln.Close()
		return fmt.Errorf("agent: proxy socket: %w", err)
	}
	s.ln = ln
	go s.serve(ln)
	return nil
}

func (s *proxySocket) serve(ln net.Listener) {
	acceptEach(ln, func(c net.Conn) {
		if uc, ok := c.(*net.UnixConn); ok {
			_ = uc.SetWriteBuffer(socketBuffer)
		}
		sc := &socketConn{Conn: c, s: s}
		if !s.track(sc) {
			c.Close()
			return
		}
		takeProxy(sc, s.proxy)
	})
}

// acceptEach serves each connection ln accepts with serve, on a goroutine
// of its own, until ln closes.
func acceptEach(ln net.Listener, serve func(net.Conn)) {
	pause := 5 * time.Millisecond
	for {
		c, err := ln.Accept()
		if errors.Is(err, net.ErrClosed) {
			return
		}
		if err != nil { // out of descriptors, most likely: wait a little
			log.Printf("%s: %v", ln.Addr(), err)
			time.Sleep(pause)
			pause = min(2*pause, time.Second)
			continue
		}
		pause = 5 * time.Millisecond
		go serve(c)
	}
}

// takeProxy reads the header of a proxy connection (a stream, or one of
// the proxy socket) and hands it to proxy, with the run it names.
func takeProxy(c net.Conn, proxy func(net.Conn, uint32)) {
	_ = c.SetReadDeadline(time.Now().Add(headerTimeout))
	h, err := readStreamHeader(c)
	if err != nil || h.kind != streamProxy || proxy == nil {
		c.Close()
		return
	}
	_ = c.SetReadDeadline(time.Time{})
	proxy(c, h.run)
}

func (s *proxySocket) track(c *socketConn) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ln == nil || len(s.conns) >= maxSocketConns {
		return false
	}
	s.conns[c] = struct{}{}
	return true
}

// stop closes the listener, which drops the connections it had not
// taken, and every connection it took; with end, for good.
func (s *proxySocket) stop(end bool) {
	s.mu.Lock()
	ln, conns := s.ln, s.conns
	s.ln, s.conns = nil, map[*socketConn]struct{}{}
	s.done = s.done || end
	s.mu.Unlock()
	if ln != nil {
		ln.Close() // removes the socket's file
	}
	for c := range conns {
		c.Conn.Close()
	}
}

// ResumeProxy listens on the proxy socket again after a reset (Reset
// closed it), if there is one. Should it fail, programs' connections go
// as streams.
func (c *Conn) ResumeProxy() error {
	if c.sock == nil {
		return nil
	}
	return c.sock.listen()
}

// socketConn is a connection the proxy socket took, forgotten as it is
// closed.
type socketConn struct {
	net.Conn
	s    *proxySocket
	once sync.Once
}

func (c *socketConn) Close() error {
	c.once.Do(func() {
		c.s.mu.Lock()
		delete(c.s.conns, c)
		c.s.mu.Unlock()
	})
	return c.Conn.Close()
}
