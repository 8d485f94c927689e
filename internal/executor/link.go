package executor

import (
	"context"
	"errors"
	"net"
	"sync/atomic"
	"time"

	"github.com/runbox-dev/runbox/internal/files"
	"github.com/runbox-dev/runbox/internal/link"
	"github.com/runbox-dev/runbox/internal/sandbox"
)

// The executor is the api's way to the sandboxes it holds (link.Backend):
// streams to their ports, files written into a running project, the
// recent output of background runs.

// WriteFiles writes files into a conversation's folder here, which its
// sandboxes mount; with a remote file store, into the working copy and
// then the store, so that the next run anywhere finds them.
func (e *Executor) WriteFiles(ctx context.Context, conv string, fs []link.File) error {
	// One at a time with the conversation's runs' pulls and pushes, and
	// with other writes: a working copy's manifest has one user at a time.
	unlock := e.convs.lock(conv)
	defer unlock()
	var before []files.Entry
	if e.cfg.Copies != nil {
		var err error
		if before, err = e.folders.List(conv); err != nil {
			return err
		}
	}
	put := make([]files.PutFile, len(fs))
	for i, f := range fs {
		put[i] = files.PutFile{Name: f.Path, Data: f.Data}
	}
	if err := e.folders.Put(conv, put); err != nil {
		return err
	}
	if c := e.cfg.Copies; c != nil {
		after, err := e.folders.List(conv)
		if err != nil {
			return err
		}
		return c.Push(ctx, conv, before, after)
	}
	return nil
}

// Output returns the recent output of a background run running here.
func (e *Executor) Output(run string) (link.Output, bool) { return e.backgrounds.output(run) }

// Sandboxes returns the ids of a conversation's live sandboxes here.
func (e *Executor) Sandboxes(conv string) []string { return e.sandboxes.Sandboxes(conv) }

// DialPort connects to a port a program of the conversation listens on.
// A stream, and the bytes it carries, keep the conversation's background
// runs from going idle.
func (e *Executor) DialPort(ctx context.Context, conv string, port int) (net.Conn, error) {
	c, err := e.sandboxes.DialPort(ctx, conv, port)
	if errors.Is(err, sandbox.ErrNotListening) {
		return nil, link.ErrNotListening
	}
	if err != nil {
		return nil, err
	}
	e.backgrounds.touch(conv, e.cfg.Clock.Now())
	return &activeConn{Conn: c, touch: func() { e.backgrounds.touch(conv, e.cfg.Clock.Now()) }}, nil
}

// activeConn marks its conversation's background runs active as bytes
// pass, at most once a second.
type activeConn struct {
	net.Conn
	touch func()
	last  atomic.Int64 // unix seconds
}

func (c *activeConn) mark() {
	now := time.Now().Unix()
	if c.last.Swap(now) != now {
		c.touch()
	}
}

func (c *activeConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if n > 0 {
		c.mark()
	}
	return n, err
}

func (c *activeConn) Write(p []byte) (int, error) {
	c.mark()
	return c.Conn.Write(p)
}

// CloseWrite passes a half-close on to the stream.
func (c *activeConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return c.Conn.Close()
}

var _ link.Backend = (*Executor)(nil)
