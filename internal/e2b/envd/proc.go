package envd

import (
	"context"
	"errors"
	"io"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"time"

	"connectrpc.com/connect"
	"github.com/creack/pty"

	ppb "github.com/runbox-dev/runbox/internal/e2b/envdpb/process"
)

// Bounds of a process's output.
const (
	// chunkSize is the most output one data event carries.
	chunkSize = 32 << 10
	// subscriberQueue is how many events wait for one client: a client
	// that does not read holds at most this many chunks, and then holds
	// the process's output back until Limits.Stall cuts it off.
	subscriberQueue = 16
	// drainTimeout bounds the wait for a process's output to end after
	// it exited (a program it left in the background may hold it).
	drainTimeout = 2 * time.Second
)

// errCut ends the stream of a client that did not read a process's
// output for Limits.Stall.
var errCut = errors.New("the client did not read the process's output in time; connect again to follow it")

// proc is one process the daemon started, and the clients following it.
type proc struct {
	pid    uint32
	tag    *string
	config *ppb.ProcessConfig
	cmd    *exec.Cmd
	tty    *os.File // the terminal's master side; nil without one
	stall  time.Duration

	inMu  sync.Mutex
	stdin *os.File // the write end of its input; nil when closed or never open

	mu   sync.Mutex
	subs map[*subscriber]struct{}
	end  *ppb.ProcessEvent_EndEvent // once it ended
	done chan struct{}              // closed once it ended and its end was told
}

// subscriber is one client following a process.
type subscriber struct {
	events chan *ppb.ProcessEvent
	cut    chan struct{} // closed when the process gave up on it
	once   sync.Once
}

func newSubscriber() *subscriber {
	return &subscriber{events: make(chan *ppb.ProcessEvent, subscriberQueue), cut: make(chan struct{})}
}

func (s *subscriber) drop() { s.once.Do(func() { close(s.cut) }) }

// subscribe adds a client; false when the process has ended.
func (p *proc) subscribe(s *subscriber) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.end != nil {
		return false
	}
	p.subs[s] = struct{}{}
	return true
}

func (p *proc) unsubscribe(s *subscriber) {
	p.mu.Lock()
	delete(p.subs, s)
	p.mu.Unlock()
}

// broadcast hands ev to every client, each within the stall bound: one
// that does not take it in time is cut off. Output is held back (the
// process blocks on its pipe) while a client catches up, never queued
// without bound.
func (p *proc) broadcast(ev *ppb.ProcessEvent) {
	p.mu.Lock()
	subs := make([]*subscriber, 0, len(p.subs))
	for s := range p.subs {
		subs = append(subs, s)
	}
	p.mu.Unlock()
	for _, s := range subs {
		select {
		case s.events <- ev:
			continue
		case <-s.cut:
			continue
		default:
		}
		t := time.NewTimer(p.stall)
		select {
		case s.events <- ev:
		case <-s.cut:
		case <-t.C:
			p.unsubscribe(s)
			s.drop()
		}
		t.Stop()
	}
}

// pump reads one of the process's outputs until it ends, as data events
// made by wrap.
func (p *proc) pump(r io.Reader, wrap func([]byte) *ppb.ProcessEvent_DataEvent) {
	for {
		buf := make([]byte, chunkSize)
		n, err := r.Read(buf)
		if n > 0 {
			p.broadcast(&ppb.ProcessEvent{Event: &ppb.ProcessEvent_Data{Data: wrap(buf[:n])}})
		}
		if err != nil {
			return
		}
	}
}

// start starts the process with its outputs: a terminal, or pipes.
func (p *proc) start(withStdin bool, size *ppb.PTY_Size) error {
	if size != nil {
		return p.startTTY(size)
	}
	outR, outW, err := os.Pipe()
	if err != nil {
		return err
	}
	errR, errW, err := os.Pipe()
	if err != nil {
		outR.Close()
		outW.Close()
		return err
	}
	var inR *os.File
	if withStdin {
		if inR, p.stdin, err = os.Pipe(); err != nil {
			closeAll(outR, outW, errR, errW)
			return err
		}
		p.cmd.Stdin = inR
	}
	p.cmd.Stdout, p.cmd.Stderr = outW, errW
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	err = p.cmd.Start()
	closeAll(outW, errW, inR)
	if err != nil {
		closeAll(outR, errR, p.stdin)
		p.stdin = nil
		return err
	}
	p.pid = uint32(p.cmd.Process.Pid)
	var wg sync.WaitGroup
	wg.Go(func() { p.pump(outR, stdoutEvent) })
	wg.Go(func() { p.pump(errR, stderrEvent) })
	go p.wait(&wg, outR, errR)
	return nil
}

// startTTY starts the process on a new terminal of size, in a session of
// its own.
func (p *proc) startTTY(size *ppb.PTY_Size) error {
	tty, err := pty.StartWithSize(p.cmd, &pty.Winsize{Rows: uint16(size.GetRows()), Cols: uint16(size.GetCols())})
	if err != nil {
		return err
	}
	p.tty = tty
	p.pid = uint32(p.cmd.Process.Pid)
	var wg sync.WaitGroup
	wg.Go(func() { p.pump(tty, ptyEvent) })
	go p.wait(&wg, tty)
	return nil
}

func stdoutEvent(b []byte) *ppb.ProcessEvent_DataEvent {
	return &ppb.ProcessEvent_DataEvent{Output: &ppb.ProcessEvent_DataEvent_Stdout{Stdout: b}}
}

func stderrEvent(b []byte) *ppb.ProcessEvent_DataEvent {
	return &ppb.ProcessEvent_DataEvent{Output: &ppb.ProcessEvent_DataEvent_Stderr{Stderr: b}}
}

func ptyEvent(b []byte) *ppb.ProcessEvent_DataEvent {
	return &ppb.ProcessEvent_DataEvent{Output: &ppb.ProcessEvent_DataEvent_Pty{Pty: b}}
}

func closeAll(fs ...*os.File) {
	for _, f := range fs {
		if f != nil {
			f.Close()
		}
	}
}

// wait waits for the process to exit and its output to end (or
// drainTimeout after its exit), then tells its end to every client.
func (p *proc) wait(pumps *sync.WaitGroup, outputs ...*os.File) {
	err := p.cmd.Wait()
	drained := make(chan struct{})
	go func() { pumps.Wait(); close(drained) }()
	select {
	case <-drained:
	case <-time.After(drainTimeout):
		closeAll(outputs...)
		<-drained
	}
	closeAll(outputs...)
	end := endOf(p.cmd.ProcessState, err)
	p.mu.Lock()
	p.end = end
	subs := p.subs
	p.subs = nil
	p.mu.Unlock()
	ev := &ppb.ProcessEvent{Event: &ppb.ProcessEvent_End{End: end}}
	for s := range subs {
		select {
		case s.events <- ev:
		case <-s.cut:
		case <-time.After(p.stall):
			s.drop()
		}
	}
	p.inMu.Lock()
	closeAll(p.stdin)
	p.stdin = nil
	p.inMu.Unlock()
	close(p.done)
}

// endOf is a process's end as clients are told it.
func endOf(st *os.ProcessState, waitErr error) *ppb.ProcessEvent_EndEvent {
	end := &ppb.ProcessEvent_EndEvent{ExitCode: -1}
	if st == nil {
		msg := "the process could not be waited for"
		if waitErr != nil {
			msg = waitErr.Error()
		}
		end.Status, end.Error = "unknown", &msg
		return end
	}
	ws, _ := st.Sys().(syscall.WaitStatus)
	end.Exited = ws.Exited()
	end.ExitCode = int32(st.ExitCode())
	end.Status = st.String()
	return end
}

// input writes data to the process's input, its terminal's or its
// stdin, within ctx.
func (p *proc) input(ctx context.Context, data []byte, toTTY bool) error {
	var f *os.File
	p.inMu.Lock()
	defer p.inMu.Unlock()
	switch {
	case toTTY && p.tty != nil:
		f = p.tty
	case toTTY:
		return connect.NewError(connect.CodeFailedPrecondition, errors.New("the process has no terminal"))
	case p.stdin != nil:
		f = p.stdin
	case p.tty != nil:
		// Input for a terminal's process is the terminal's.
		f = p.tty
	default:
		return connect.NewError(connect.CodeFailedPrecondition, errors.New("the process's stdin is not open (start it with stdin)"))
	}
	deadline, ok := ctx.Deadline()
	if !ok {
		deadline = time.Now().Add(p.stall)
	}
	_ = f.SetWriteDeadline(deadline)
	if _, err := f.Write(data); err != nil {
		if errors.Is(err, os.ErrDeadlineExceeded) {
			return connect.NewError(connect.CodeDeadlineExceeded, errors.New("the process does not read its input"))
		}
		return connect.NewError(connect.CodeFailedPrecondition, err)
	}
	return nil
}

// closeStdin closes the process's stdin (end of file).
func (p *proc) closeStdin() error {
	p.inMu.Lock()
	defer p.inMu.Unlock()
	switch {
	case p.tty != nil:
		return connect.NewError(connect.CodeFailedPrecondition, errors.New("a terminal's input is ended with Ctrl-D (\\x04), not closed"))
	case p.stdin == nil:
		return nil
	}
	err := p.stdin.Close()
	p.stdin = nil
	return err
}

// signal sends sig to the process's group: what it started with it.
func (p *proc) signal(sig syscall.Signal) error {
	if err := syscall.Kill(-int(p.pid), sig); err != nil && !errors.Is(err, syscall.ESRCH) {
		return err
	}
	return nil
}

// resize changes the process's terminal's size.
func (p *proc) resize(size *ppb.PTY_Size) error {
	if p.tty == nil {
		return connect.NewError(connect.CodeFailedPrecondition, errors.New("the process has no terminal"))
	}
	return pty.Setsize(p.tty, &pty.Winsize{Rows: uint16(size.GetRows()), Cols: uint16(size.GetCols())})
}
