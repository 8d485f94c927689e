package agent

import (
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"

	"github.com/hashicorp/yamux"
)

// Byte streams between the executor and the sandbox ride the protocol too:
// frameMuxIn and frameMuxOut carry a yamux session, so that each stream has
// its own flow control and a stream nobody reads never holds up the frame
// reader, a program's output or another stream. Either end opens streams;
// each starts with a streamHeader saying what it is:
//
//   - streamDial (executor → agent): connect to a port on the sandbox's
//     loopback and carry that connection (previews);
//   - streamListening (executor → agent): is anything listening on a port;
//   - streamProxy (agent → executor): a connection a program made to the
//     agent's proxy listener, for the executor's egress proxy;
//   - streamSave and streamRestore (executor → agent): a snapshot of the
//     kept interpreter's namespace, out of the sandbox or into it
//     (state.go).
//
// On the proxy socket (proxysocket.go) a connection may instead start with
// streamPassed: the same header, sent with the program's connection's own
// descriptor, which the executor then serves directly.
//
// The session lives as long as the sandbox's conversation: a reset closes
// it, with every stream, on both ends (in the order of the frames around
// the reset, so that no stream of one conversation reaches the next), and
// the ends start a new one when the reset is done.

const (
	frameMuxIn  = 'M' // executor → agent: bytes of the yamux session
	frameMuxOut = 'm' // agent → executor: bytes of the yamux session
)

// Stream kinds, the first byte of a stream.
const (
	streamDial      = 'D'
	streamListening = 'L'
	streamProxy     = 'P'
	streamPassed    = 'F' // the proxy socket's only
	streamSave      = 'S'
	streamRestore   = 'V'
)

// Answers to a dial or listening stream, its first byte back.
const (
	answerYes    = 0 // connected; something listens
	answerNo     = 1 // nothing listens
	answerFailed = 2 // the agent could not tell
)

// streamHeader is what a stream is: a kind and its argument, a port for
// dial and listening streams, the agent's run number for proxy streams,
// flags for a restore (none for a save).
type streamHeader struct {
	kind  byte
	port  uint16
	run   uint32
	flags byte
}

// headerTimeout bounds the wait for a stream's header and answer.
const headerTimeout = 10 * time.Second

var errBadHeader = errors.New("agent: malformed stream header")

func (h streamHeader) encode() []byte {
	switch h.kind {
	case streamProxy, streamPassed:
		b := []byte{h.kind, 0, 0, 0, 0}
		binary.BigEndian.PutUint32(b[1:], h.run)
		return b
	case streamSave:
		return []byte{h.kind}
	case streamRestore:
		return []byte{h.kind, h.flags}
	default:
		b := []byte{h.kind, 0, 0}
		binary.BigEndian.PutUint16(b[1:], h.port)
		return b
	}
}

// readStreamHeader reads a stream's header. What the agent sends is as
// untrusted as the program beside it.
func readStreamHeader(r io.Reader) (streamHeader, error) {
	var b [5]byte
	if _, err := io.ReadFull(r, b[:1]); err != nil {
		return streamHeader{}, err
	}
	h := streamHeader{kind: b[0]}
	switch h.kind {
	case streamDial, streamListening:
		if _, err := io.ReadFull(r, b[1:3]); err != nil {
			return streamHeader{}, err
		}
		h.port = binary.BigEndian.Uint16(b[1:3])
		if h.port == 0 {
			return streamHeader{}, errBadHeader
		}
	case streamProxy:
		if _, err := io.ReadFull(r, b[1:5]); err != nil {
			return streamHeader{}, err
		}
		h.run = binary.BigEndian.Uint32(b[1:5])
	case streamSave:
	case streamRestore:
		if _, err := io.ReadFull(r, b[1:2]); err != nil {
			return streamHeader{}, err
		}
		h.flags = b[1]
	default:
		return streamHeader{}, fmt.Errorf("%w: kind %q", errBadHeader, h.kind)
	}
	return h, nil
}

// Receive windows: how much of a stream's data an end takes before its
// reader has read it. Every round trip for more costs a trip through the
// Docker Engine both ways, so the windows are wide; the sandbox's end
// holds what it takes in the sandbox's memory, the executor's in its own,
// for every stream of every sandbox: narrower there.
const (
	agentWindow    = 4 << 20
	executorWindow = 1 << 20
)

// muxConfig is the yamux configuration of an end.
func muxConfig(window uint32) *yamux.Config {
	c := yamux.DefaultConfig()
	// The session ends with the attach stream (the container); nothing
	// between the ends drops idle connections.
	c.EnableKeepAlive = false
	c.LogOutput = io.Discard
	// A peer that never acknowledges a stream loses its session.
	c.StreamOpenTimeout = 30 * time.Second
	// A stream closed here while the peer still sends is reset after this.
	// A restore closes its side when the snapshot is sent and then waits
	// for the answer, which comes only once the interpreter has imported
	// and rebuilt the state: tens of seconds for a large one in a cold
	// sandbox on a loaded host. The caller's context bounds that wait; this
	// only reclaims streams a peer abandoned, and the session ends with the
	// sandbox anyway.
	c.StreamCloseTimeout = 2 * time.Minute
	c.MaxStreamWindowSize = window
	return c
}

// muxChunk is the most session bytes one frame carries: a few frames a
// window, each one write down the attach stream, and short enough for a
// program's output to interleave.
const muxChunk = 128 << 10

// muxQueue bounds the frames of session bytes waiting for the session's
// reader. It reads without ever waiting for a stream (yamux buffers each
// stream's data up to its window), so the queue fills only while the
// session cannot write either.
const muxQueue = 64

// muxConn carries a yamux session over frames: it reads the payloads the
// frame reader feeds it and writes its bytes as frames of type typ.
type muxConn struct {
	fw   *frameWriter
	typ  byte
	in   chan []byte
	cur  []byte
	done chan struct{}
	once sync.Once
	// held is the header of a data message, written alone by yamux and
	// sent with its body, which its next write carries: one frame, and
	// one write down the attach stream, instead of two.
	held []byte
}

// yamux's message header: version, type, flags, stream, length.
const (
	yamuxHeaderSize = 12
	yamuxTypeData   = 0
)

func newMuxConn(fw *frameWriter, typ byte) *muxConn {
	return &muxConn{fw: fw, typ: typ, in: make(chan []byte, muxQueue), done: make(chan struct{})}
}

// feed hands the session bytes that arrived; dropped once it is closed.
func (c *muxConn) feed(p []byte) {
	select {
	case c.in <- p:
	case <-c.done:
	}
}

func (c *muxConn) Read(p []byte) (int, error) {
	for len(c.cur) == 0 {
		select {
		case b := <-c.in:
			c.cur = b
		case <-c.done:
			return 0, io.EOF
		}
	}
	n := copy(p, c.cur)
	c.cur = c.cur[n:]
	return n, nil
}

// Write sends p in frames of at most muxChunk bytes (and a held header),
// so that a program's output interleaves with a large write. Only the
// session's one sending goroutine writes.
func (c *muxConn) Write(p []byte) (int, error) {
	if len(p) == yamuxHeaderSize && p[1] == yamuxTypeData && binary.BigEndian.Uint32(p[8:]) > 0 && c.held == nil {
		c.held = append([]byte(nil), p...)
		return len(p), nil
	}
	written := 0
	for len(p) > 0 {
		select {
		case <-c.done:
			return written, net.ErrClosed
		default:
		}
		n := min(len(p), muxChunk)
		frame := p[:n]
		if c.held != nil {
			frame = append(c.held, frame...)
			c.held = nil
		}
		if err := c.fw.write(c.typ, frame); err != nil {
			return written, err
		}
		written += n
		p = p[n:]
	}
	return written, nil
}

func (c *muxConn) Close() error {
	c.once.Do(func() { close(c.done) })
	return nil
}

// muxEnd is one end's current session, if any.
type muxEnd struct {
	fw     *frameWriter
	typ    byte // frames this end writes
	server bool
	// accept handles each stream the peer opens, in a goroutine of its own.
	accept func(*yamux.Stream)

	mu   sync.Mutex
	conn *muxConn
	sess *yamux.Session
}

// open starts a new session, closing the current one.
func (e *muxEnd) open() {
	e.close()
	conn := newMuxConn(e.fw, e.typ)
	var sess *yamux.Session
	if e.server {
		sess, _ = yamux.Server(conn, muxConfig(agentWindow)) // fails only on a bad config
	} else {
		sess, _ = yamux.Client(conn, muxConfig(executorWindow))
	}
	e.mu.Lock()
	e.conn, e.sess = conn, sess
	e.mu.Unlock()
	go func() {
		for {
			st, err := sess.AcceptStream()
			if err != nil {
				return
			}
			go e.accept(st)
		}
	}()
}

// close ends the current session and every stream of it. Once it returns,
// the session writes no more frames.
func (e *muxEnd) close() {
	e.mu.Lock()
	conn, sess := e.conn, e.sess
	e.conn, e.sess = nil, nil
	e.mu.Unlock()
	if sess != nil {
		conn.Close()
		sess.Close()
	}
}

// feed hands session bytes to the current session; without one (a reset
// is under way) they belong to a closed one and are dropped.
func (e *muxEnd) feed(p []byte) {
	e.mu.Lock()
	conn := e.conn
	e.mu.Unlock()
	if conn != nil {
		conn.feed(p)
	}
}

// session returns the current session, or nil.
func (e *muxEnd) session() *yamux.Session {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.sess
}

// closeWriter is a connection whose sending side can be closed alone.
type closeWriter interface {
	CloseWrite() error
}

// splice copies between a and b until both directions end, half-closing
// each side as its peer finishes, then closes both.
func splice(a, b net.Conn) {
	var wg sync.WaitGroup
	wg.Go(func() { halfCopy(a, b) })
	halfCopy(b, a)
	wg.Wait()
	a.Close()
	b.Close()
}

// spliceToPort copies between c, a connection to a port in the sandbox,
// and st, the executor's stream to it. The server's end passes on as a
// half-close (it may have said all it will and still read), but the
// executor's is the whole stream's: the api ends a stream only as a whole
// (the browser went, or the preview's idle time, limits or expiry ended
// it), and a yamux stream's close is the only way to say so. A server
// that never reads, or that holds a connection its peer half-closed,
// would otherwise keep the connection, these copies and the stream on
// both ends for as long as it lives.
func spliceToPort(c, st net.Conn) {
	var wg sync.WaitGroup
	wg.Go(func() { halfCopy(st, c) })
	_, _ = io.Copy(c, st)
	c.Close() // ends the copy above: its read fails
	wg.Wait()
	st.Close()
}

// halfCopy copies src to dst, then half-closes dst.
func halfCopy(dst, src net.Conn) {
	_, _ = io.Copy(dst, src)
	if cw, ok := dst.(closeWriter); ok {
		_ = cw.CloseWrite()
	} else {
		_ = dst.Close()
	}
}
