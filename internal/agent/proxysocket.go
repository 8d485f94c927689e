package agent

import (
	"bytes"
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// The proxy socket is the fast way out of a sandbox for its programs'
// proxy connections: a Unix socket the executor listens on, in a folder
// of the host mounted into the sandbox (ProxySocket). The agent hands a
// connection its proxy listener took to the executor over a connection
// to it, which starts with the same header as a proxy stream (the
// agent's run number):
//
//   - with the program's connection's descriptor itself (streamPassed),
//     where the socket carries descriptors (runc): the executor's proxy
//     then reads and writes the program's connection directly, and no
//     byte crosses the agent;
//   - else (gVisor's sockets to the host carry none) followed by its
//     bytes, which the agent copies both ways: one socket pair in each
//     direction instead of the protocol's frames through the Docker
//     Engine.
//
// Where the executor mounted none (a Docker Engine on another host), or it
// cannot be reached (gVisor without --host-uds=open), connections go as
// streams.
//
// A program can reach the socket as well as the agent can: what it sends
// there is no more trusted than what it sends to the proxy listener. The
// run number it could forge is checked against the run the sandbox runs
// (as for a stream); a descriptor it passes is served only if it is a
// TCP connection (one of the sandbox's own, as the agent's are: the
// sandbox has no other network); and a reset closes the socket's
// connections, passed ones with them, drops those not yet taken with the
// listener, and listens anew, so that none made in one conversation is
// served in the next.

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

// toProxySocket hands c, a connection a program made to the proxy
// listener in run, to the executor's proxy socket at path: passed where
// the socket takes descriptors, else copied; once the socket has taken
// the header but not the descriptor, copyOnly is set and later ones are
// copied straight away. It returns false if the socket could not be
// reached; c is the socket's otherwise.
func toProxySocket(path string, c net.Conn, run uint32, copyOnly *atomic.Bool) bool {
	uc, err := dialProxySocket(path)
	if err != nil {
		return false
	}
	if !copyOnly.Load() && passConn(uc, c, run) == nil {
		uc.Close()
		c.Close() // the executor holds the connection now
		return true
	}
	if _, err := uc.Write(streamHeader{kind: streamProxy, run: run}.encode()); err != nil {
		uc.Close()
		c.Close()
		return true
	}
	copyOnly.Store(true)
	splice(c, uc)
	return true
}

// dialProxySocket connects to the executor's proxy socket at path.
func dialProxySocket(path string) (*net.UnixConn, error) {
	c, err := net.DialTimeout("unix", path, dialTimeout)
	if err != nil {
		return nil, err
	}
	uc := c.(*net.UnixConn)
	_ = uc.SetReadBuffer(socketBuffer)
	return uc, nil
}

// passConn sends c's descriptor over uc, with the header of run's
// connection. It fails, having sent nothing, where uc carries no
// descriptors (gVisor's sockets to the host) or c is not TCP.
func passConn(uc *net.UnixConn, c net.Conn, run uint32) error {
	tc, ok := c.(*net.TCPConn)
	if !ok {
		return errors.New("agent: not a TCP connection")
	}
	raw, err := tc.SyscallConn()
	if err != nil {
		return err
	}
	var serr error
	err = raw.Control(func(fd uintptr) {
		_, _, serr = uc.WriteMsgUnix(streamHeader{kind: streamPassed, run: run}.encode(), syscall.UnixRights(int(fd)), nil)
	})
	return cmp.Or(err, serr)
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
		s.take(sc)
	})
}

// take reads the header of a connection to the socket and hands the
// connection, or the one passed with the header, to proxy.
func (s *proxySocket) take(sc *socketConn) {
	uc := sc.Conn.(*net.UnixConn)
	_ = uc.SetReadDeadline(time.Now().Add(headerTimeout))
	h, passed, err := readSocketHeader(uc)
	if err != nil || s.proxy == nil {
		sc.Close()
		return
	}
	if passed == nil {
		_ = uc.SetReadDeadline(time.Time{})
		s.proxy(sc, h.run)
		return
	}
	// The passed connection takes the socket connection's place: closed
	// at a reset, counted against the bound.
	pc := &socketConn{Conn: passed, s: s}
	ok := s.replace(sc, pc)
	sc.Conn.Close()
	if !ok {
		passed.Close()
		return
	}
	s.proxy(pc, h.run)
}

// readSocketHeader reads the header of a connection to the proxy socket,
// and for streamPassed the TCP connection passed with it. Whatever else
// arrives with the header (descriptors of another kind, more than one, or
// with a header of another kind) is closed.
func readSocketHeader(uc *net.UnixConn) (streamHeader, net.Conn, error) {
	var b [5]byte
	// Room for one descriptor: the kernel closes any beyond it.
	oob := make([]byte, syscall.CmsgSpace(4))
	n, oobn, flags, _, err := uc.ReadMsgUnix(b[:], oob)
	passed := passedConn(oob[:oobn], flags&syscall.MSG_CTRUNC != 0)
	if err != nil {
		closeConn(passed)
		return streamHeader{}, nil, err
	}
	if b[0] != streamPassed {
		closeConn(passed)
		h, err := readStreamHeader(io.MultiReader(bytes.NewReader(b[:n]), uc))
		if err == nil && h.kind != streamProxy {
			err = fmt.Errorf("%w: kind %q on the proxy socket", errBadHeader, h.kind)
		}
		return h, nil, err
	}
	if n != len(b) || passed == nil {
		closeConn(passed)
		return streamHeader{}, nil, fmt.Errorf("%w: no connection passed with the header", errBadHeader)
	}
	return streamHeader{kind: streamPassed, run: binary.BigEndian.Uint32(b[1:])}, passed, nil
}

// passedConn returns the TCP connection oob passes, or nil if it passes
// none, another kind of descriptor, or more than one (truncated: some
// did not fit); every descriptor it does not return is closed.
func passedConn(oob []byte, truncated bool) net.Conn {
	msgs, err := syscall.ParseSocketControlMessage(oob)
	if err != nil {
		return nil
	}
	var fds []int
	for _, m := range msgs {
		if got, err := syscall.ParseUnixRights(&m); err == nil {
			fds = append(fds, got...)
		}
	}
	if len(fds) != 1 || truncated {
		for _, fd := range fds {
			syscall.Close(fd)
		}
		return nil
	}
	f := os.NewFile(uintptr(fds[0]), "passed")
	defer f.Close() // FileConn holds a copy
	c, err := net.FileConn(f)
	if err != nil {
		return nil
	}
	if _, ok := c.(*net.TCPConn); !ok {
		c.Close()
		return nil
	}
	return c
}

func closeConn(c net.Conn) {
	if c != nil {
		c.Close()
	}
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

// replace puts pc in old's place among the connections the socket took;
// false after a reset or the end, which closed old.
func (s *proxySocket) replace(old, pc *socketConn) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, ok := s.conns[old]; !ok {
		return false
	}
	delete(s.conns, old)
	s.conns[pc] = struct{}{}
	return true
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
