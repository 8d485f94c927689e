package agent

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
)

// Conn is the executor's end of the protocol. Its send methods are safe for
// concurrent use; Recv is not.
type Conn struct {
	r *bufio.Reader
	w *frameWriter
}

// NewConn speaks the protocol with an agent that reads w and writes r.
func NewConn(r io.Reader, w io.Writer) *Conn {
	return &Conn{r: bufio.NewReaderSize(r, chunkSize+64), w: newFrameWriter(w)}
}

// Hello reads the agent's greeting, which is always its first frame.
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
	return h, nil
}

// Start asks the agent to run a program.
func (c *Conn) Start(run Run) error { return c.w.writeJSON(frameRun, run) }

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
// ResetDone message.
func (c *Conn) Reset() error { return c.w.write(frameReset, nil) }

// Kill asks the agent to kill the running program.
func (c *Conn) Kill() error { return c.w.write(frameKill, nil) }

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
	typ, payload, err := readFrame(c.r)
	if err != nil {
		return Message{}, err
	}
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
