package agent

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/yamux"
)

// Conn is the executor's end of the protocol. Its send methods, Dial and
// Listening are safe for concurrent use; Recv is not.
//
// Once the agent's hello is read, one goroutine reads every frame the
// agent sends: the bytes of streams go to the stream session at once, and
// messages wait for Recv in a queue. So streams move whether or not a run
// is being followed, and a stream nobody reads never stalls a program's
// output (yamux bounds each stream's data by its window).
type Conn struct {
	r *bufio.Reader
	w *frameWriter

	start sync.Once
	msgs  chan Message // from the reader; closed when it ends
	err   error        // why the reader ended, set before msgs is closed

	mux     muxEnd
	streams atomic.Bool // the agent speaks streams
	proxy   func(net.Conn, uint32)
	sock    *proxySocket  // nil without one (ListenProxy)
	runs    atomic.Uint32 // runs started
}

// msgQueue bounds the messages read ahead of Recv.
const msgQueue = 64

// NewConn speaks the protocol with an agent that reads w and writes r.
func NewConn(r io.Reader, w io.Writer) *Conn {
	c := &Conn{r: bufio.NewReaderSize(r, chunkSize+64), w: newFrameWriter(w)}
	c.mux = muxEnd{fw: c.w, typ: frameMuxIn, accept: c.acceptStream}
	return c
}

// OnProxy sets what receives the connections programs make to the agent's
// proxy listener, with the number of the run the agent was running then
// (see NextRun). Call it before Hello. Without it they are closed.
func (c *Conn) OnProxy(f func(conn net.Conn, run uint32)) { c.proxy = f }

// Hello reads the agent's greeting, which is always its first frame, and
// starts reading what follows.
func (c *Conn) Hello() (Hello, error) {
	typ, payload, err := readFrame(c.r)
	if err != nil {
		return Hello{}, fmt.Errorf("read hello: %w", err)
	}
	var h Hello
	if typ != frameHello {
		return h, fmt.Errorf("agent: expected hello, got frame %q", typ)
	}
	if err := json.Unmarshal(payload, &h); err != nil {
		return h, fmt.Errorf("agent: malformed hello: %w", err)
	}
	if h.Version >= streamsVersion {
		c.streams.Store(true)
		c.mux.open()
	}
	c.start.Do(c.startReader)
	return h, nil
}

func (c *Conn) startReader() {
	c.msgs = make(chan Message, msgQueue)
	go c.read()
}

// read reads frames until the agent's output ends or breaks protocol.
func (c *Conn) read() {
	defer close(c.msgs)
	defer c.mux.close()
	for {
		typ, payload, err := readFrame(c.r)
		if err != nil {
			c.err = err
			return
		}
		if typ == frameMuxOut {
			c.mux.feed(payload)
			continue
		}
		m, err := parseMessage(typ, payload)
		if err != nil {
			c.err = err
			return
		}
		if m.Kind == ResetDone && c.streams.Load() {
			// Frames after this one belong to the session the agent
			// started for the next conversation.
			c.mux.open()
		}
		c.msgs <- m
	}
}

// streamsVersion is the first protocol version with streams.
const streamsVersion = 2

// Start asks the agent to run a program.
func (c *Conn) Start(run Run) error {
	c.runs.Add(1)
	return c.w.writeJSON(frameRun, run)
}

// NextRun returns the number the agent gives the next program Start
// starts: proxy connections made while it runs carry it.
func (c *Conn) NextRun() uint32 { return c.runs.Load() + 1 }

// Stdin sends input for the running program.
func (c *Conn) Stdin(p []byte) error {
	for len(p) > 0 {
		n := min(len(p), chunkSize)
		if err := c.w.write(frameStdin, p[:n]); err != nil {
			return err
		}
		p = p[n:]
	}
	return nil
}

// CloseStdin closes the running program's input.
func (c *Conn) CloseStdin() error { return c.w.write(frameEOF, nil) }

// Reset asks the agent to reset the sandbox; Recv then returns a
// ResetDone message. Every stream ends here: the next conversation starts
// with a session of its own. So does the proxy socket's every connection,
// and its listener until ResumeProxy.
func (c *Conn) Reset() error {
	c.mux.close()
	if c.sock != nil {
		c.sock.stop(false)
	}
	return c.w.write(frameReset, nil)
}

// Kill asks the agent to kill the running program.
func (c *Conn) Kill() error { return c.w.write(frameKill, nil) }

// Term asks the agent to send the running program, and what it started,
// SIGTERM; it ends as it will (or is killed by the executor later).
func (c *Conn) Term() error { return c.w.write(frameTerm, nil) }

// Close ends every stream and the proxy socket. The sandbox is going.
func (c *Conn) Close() {
	c.mux.close()
	if c.sock != nil {
		c.sock.stop(true)
	}
}

// MessageKind says what a Message carries.
type MessageKind int

const (
	Stdout MessageKind = iota + 1
	Stderr
	Exited
	Failed
	ResetDone
)

// Message is one thing the agent reported.
type Message struct {
	Kind MessageKind
	Data []byte // Stdout, Stderr
	Exit Exit   // Exited
	Err  string // Failed
	// Reset is the outcome of a reset (ResetDone).
	Reset Reset
}

// Recv returns the agent's next message. What the agent sends is as
// untrusted as the program beside it: anything out of protocol is an error.
func (c *Conn) Recv() (Message, error) {
	c.start.Do(c.startReader)
	m, ok := <-c.msgs
	if !ok {
		return Message{}, c.err
	}
	return m, nil
}

func parseMessage(typ byte, payload []byte) (Message, error) {
	switch typ {
	case frameStdout:
		return Message{Kind: Stdout, Data: payload}, nil
	case frameStderr:
		return Message{Kind: Stderr, Data: payload}, nil
	case frameExit:
		var ex Exit
		if err := json.Unmarshal(payload, &ex); err != nil {
			return Message{}, fmt.Errorf("agent: malformed exit: %w", err)
		}
		return Message{Kind: Exited, Exit: ex}, nil
	case frameReady:
		var r Reset
		if err := json.Unmarshal(payload, &r); err != nil {
			return Message{}, fmt.Errorf("agent: malformed reset: %w", err)
		}
		return Message{Kind: ResetDone, Reset: r}, nil
	case frameFail:
		var f Failure
		if err := json.Unmarshal(payload, &f); err != nil {
			return Message{}, fmt.Errorf("agent: malformed failure: %w", err)
		}
		return Message{Kind: Failed, Err: f.Message}, nil
	default:
		return Message{}, fmt.Errorf("agent: unexpected frame %q", typ)
	}
}

// Errors of Dial and Listening.
var (
	// ErrNotListening reports a port nothing in the sandbox listens on.
	ErrNotListening = errors.New("agent: nothing listens on that port")
	// ErrNoStreams reports an agent without streams (an older image),
	// or a sandbox being reset or gone.
	ErrNoStreams = errors.New("agent: no stream session")
)

// Dial connects to a port on the sandbox's loopback (IPv4, else IPv6),
// through the agent.
func (c *Conn) Dial(ctx context.Context, port int) (net.Conn, error) {
	st, answer, err := c.ask(ctx, streamDial, port)
	if err != nil {
		return nil, err
	}
	switch answer {
	case answerYes:
		return st, nil
	case answerNo:
		st.Close()
		return nil, ErrNotListening
	default:
		st.Close()
		return nil, fmt.Errorf("agent: could not connect to port %d", port)
	}
}

// Listening reports whether anything in the sandbox listens on a TCP port
// (IPv4 or IPv6).
func (c *Conn) Listening(ctx context.Context, port int) (bool, error) {
	st, answer, err := c.ask(ctx, streamListening, port)
	if err != nil {
		return false, err
	}
	st.Close()
	switch answer {
	case answerYes:
		return true, nil
	case answerNo:
		return false, nil
	default:
		return false, fmt.Errorf("agent: could not tell whether port %d is listened on", port)
	}
}

// ask opens a stream of kind about port and reads the agent's answer.
func (c *Conn) ask(ctx context.Context, kind byte, port int) (*yamux.Stream, byte, error) {
	if port < 1 || port > 65535 {
		return nil, 0, fmt.Errorf("agent: port %d out of range", port)
	}
	sess := c.mux.session()
	if sess == nil {
		return nil, 0, ErrNoStreams
	}
	st, err := sess.OpenStream()
	if err != nil {
		return nil, 0, fmt.Errorf("%w: %w", ErrNoStreams, err)
	}
	deadline := time.Now().Add(headerTimeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	_ = st.SetDeadline(deadline)
	stop := context.AfterFunc(ctx, func() { st.Close() })
	defer stop()
	var answer [1]byte
	if _, err := st.Write(streamHeader{kind: kind, port: uint16(port)}.encode()); err == nil {
		_, err = io.ReadFull(st, answer[:])
	}
	if err != nil {
		st.Close()
		if ctx.Err() != nil {
			return nil, 0, ctx.Err()
		}
		return nil, 0, fmt.Errorf("agent: stream to port %d: %w", port, err)
	}
	if !stop() {
		return nil, 0, ctx.Err() // closed by the context just now
	}
	_ = st.SetDeadline(time.Time{})
	return st, answer[0], nil
}

// acceptStream takes a stream the agent opened: a proxy connection.
func (c *Conn) acceptStream(st *yamux.Stream) { takeProxy(st, c.proxy) }
