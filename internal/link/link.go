// Package link is how the api reaches the sandboxes an executor holds: a
// byte stream to a port a program listens on (previews), files written
// into a running project, and the tail of a long-running program's
// output. An executor serves it on an address it announces with its
// heartbeat (Server); the api calls it there (Remote), or in its own
// process when the executor is embedded (Local). Requests are signed with
// a key derived from the deployment's shared secret.
package link

import (
	"context"
	"errors"
	"net"
	"slices"
)

// Errors of the link, as both ends see them.
var (
	// ErrGone reports that none of the sandboxes asked for lives (they
	// ended, or were recycled), or that the executor itself is gone.
	ErrGone = errors.New("link: the sandbox is gone")
	// ErrNotListening reports a port nothing listens on in the sandbox.
	ErrNotListening = errors.New("link: nothing listens on the port")
	// ErrNoRun reports a run whose output the executor does not hold.
	ErrNoRun = errors.New("link: the run is not running here")
)

// File is a file to write into a conversation's /data: a clean relative
// path and its content.
type File struct {
	Path string `json:"path"`
	Data []byte `json:"data"`
}

// Output is the tail of a long-running program's output.
type Output struct {
	Stdout string `json:"stdout"`
	Stderr string `json:"stderr"`
	// StdoutDropped and StderrDropped count the bytes that went before the
	// tail kept.
	StdoutDropped int64 `json:"stdout_dropped"`
	StderrDropped int64 `json:"stderr_dropped"`
}

// Backend is the executor's side: what it holds.
type Backend interface {
	// Sandboxes returns the ids of the conversation's live sandboxes (key).
	Sandboxes(conv string) []string
	// DialPort connects to a port of 127.0.0.1 in one of the conversation's
	// sandboxes; ErrNotListening when nothing listens there.
	DialPort(ctx context.Context, conv string, port int) (net.Conn, error)
	// WriteFiles writes files into the conversation's folder, which its
	// sandboxes mount.
	WriteFiles(ctx context.Context, conv string, files []File) error
	// Output returns the tail of a running program's output; false when
	// the run is not running here.
	Output(run string) (Output, bool)
}

// Link is the api's side: what it asks of an executor, by id.
type Link interface {
	// Probe returns the conversation's sandboxes on executor when port
	// listens in one of them: ErrNotListening when none listens, ErrGone
	// when it has none.
	Probe(ctx context.Context, executor, conv string, port int) ([]string, error)
	// Dial opens a stream to port in the conversation's sandboxes on
	// executor, provided one of sandboxes still lives (else ErrGone).
	// The api's end of the stream, a close or a half-close, ends it
	// whole: the agent closes its connection to the port.
	Dial(ctx context.Context, executor, conv string, port int, sandboxes []string) (net.Conn, error)
	// WriteFiles writes files into the conversation's folder on executor.
	WriteFiles(ctx context.Context, executor, conv string, files []File) error
	// Output returns the tail of a run's output on executor.
	Output(ctx context.Context, executor, run string) (Output, error)
}

// probe is Probe on a backend.
func probe(ctx context.Context, b Backend, conv string, port int) ([]string, error) {
	live := b.Sandboxes(conv)
	if len(live) == 0 {
		return nil, ErrGone
	}
	c, err := b.DialPort(ctx, conv, port)
	if err != nil {
		return nil, err
	}
	c.Close()
	return live, nil
}

// dial is Dial on a backend. A stream may reach any live sandbox of the
// conversation (they share its folder and its programs' ports are its),
// but only while one of those the URL was issued for lives: a preview
// survives neither its sandbox's end nor a recycle.
func dial(ctx context.Context, b Backend, conv string, port int, sandboxes []string) (net.Conn, error) {
	if !slices.ContainsFunc(b.Sandboxes(conv), func(id string) bool { return slices.Contains(sandboxes, id) }) {
		return nil, ErrGone
	}
	return b.DialPort(ctx, conv, port)
}

// Local is the Link of an api whose executor runs in its own process.
type Local struct {
	ID      string // the executor's
	Backend Backend
}

var _ Link = Local{}

func (l Local) backend(executor string) (Backend, error) {
	if executor != l.ID {
		return nil, ErrGone
	}
	return l.Backend, nil
}

func (l Local) Probe(ctx context.Context, executor, conv string, port int) ([]string, error) {
	b, err := l.backend(executor)
	if err != nil {
		return nil, err
	}
	return probe(ctx, b, conv, port)
}

func (l Local) Dial(ctx context.Context, executor, conv string, port int, sandboxes []string) (net.Conn, error) {
	b, err := l.backend(executor)
	if err != nil {
		return nil, err
	}
	return dial(ctx, b, conv, port, sandboxes)
}

func (l Local) WriteFiles(ctx context.Context, executor, conv string, files []File) error {
	b, err := l.backend(executor)
	if err != nil {
		return err
	}
	return b.WriteFiles(ctx, conv, files)
}

func (l Local) Output(_ context.Context, executor, run string) (Output, error) {
	b, err := l.backend(executor)
	if err != nil {
		return Output{}, err
	}
	out, ok := b.Output(run)
	if !ok {
		return Output{}, ErrNoRun
	}
	return out, nil
}
