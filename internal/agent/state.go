package agent

import (
	"cmp"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"os"
	"syscall"
	"time"

	"github.com/hashicorp/yamux"
	"golang.org/x/sys/unix"
)

// Kept state outlives its sandbox: before a sandbox with a kept
// interpreter goes, the executor asks its agent for a snapshot of the
// interpreter's namespace, and has the next sandbox's agent restore it
// before the next cell. The kernel writes and reads the snapshot itself
// (save_state and restore_state in runners/python/zygote.py) through a
// pipe the agent passes it; the agent carries it on a stream:
//
//   - streamSave: the agent answers answerYes, the snapshot in chunks
//     (uint32 length, then the bytes; a length of 0 ends them) and a JSON
//     StateSaved until the stream ends; answerNo when there is no kernel;
//     answerFailed and a JSON Failure when it cannot save.
//   - streamRestore, with a flags byte: the executor sends the snapshot
//     in chunks as above and closes its side; the agent starts a kernel,
//     which reads it, and answers a byte and a JSON StateRestored
//     (answerYes) or Failure. A snapshot without its chunks' end (the
//     executor failed to read it whole) restores nothing.
//
// A snapshot is the conversation's own program's bytes, as untrusted as
// the program: the executor encrypts it as it leaves (internal/snapshot)
// with a key the sandbox never sees, and gives it back only to the same
// conversation.

// restoreHeavy, a restore's flag, has the zygote import the data stack
// (Config.Preload) before the kernel is forked, as the saved kernel had.
const restoreHeavy = 1

// Bounds of a snapshot's transfer.
const (
	// stateChunk is the most snapshot bytes one chunk carries.
	stateChunk = 1 << 20
	// stateAnswerMax bounds a snapshot's JSON answer.
	stateAnswerMax = 64 << 10
	// stateBusyWait bounds how long a snapshot waits for the run before
	// it to be over (its goroutine holds busy a moment after its exit).
	stateBusyWait = 5 * time.Second
	// statePipeSize is asked of the pipe a snapshot crosses: a wider pipe
	// wakes both ends less often.
	statePipeSize = 1 << 20
)

// StateSaved is how a snapshot went: the variables saved, those that could
// not be (a few by name, all counted), and whether the interpreter had the
// data stack imported.
type StateSaved struct {
	Saved     int      `json:"saved"`
	Lost      []string `json:"lost,omitempty"`
	LostCount int      `json:"lost_count,omitempty"`
	Heavy     bool     `json:"heavy,omitempty"`
	// Error says why the snapshot is not whole, if it is not.
	Error string `json:"error,omitempty"`
}

// StateRestored is how a restore went: the variables restored and those
// that could not be (a module no longer importable, a class whose code
// changed).
type StateRestored struct {
	Restored  int      `json:"restored"`
	Lost      []string `json:"lost,omitempty"`
	LostCount int      `json:"lost_count,omitempty"`
}

// ErrNoState reports a sandbox without a kept interpreter to save.
var ErrNoState = errors.New("agent: no kept interpreter")

// errBusy reports a snapshot asked for while a program runs.
var errBusy = errors.New("a program is running")

// errSaveStarted wraps a save's failure once its answer byte is sent.
var errSaveStarted = errors.New("the snapshot failed")

// serveState serves a save or restore stream the executor opened.
func serveState(st *starter, s *yamux.Stream, h streamHeader) {
	defer s.Close()
	if st == nil {
		writeAnswer(s, answerFailed, Failure{Message: "the agent is starting"})
		return
	}
	if h.kind == streamSave {
		// The executor sends nothing more: its side's end means it gave
		// up, and a write blocked on it must fail.
		go func() {
			_, _ = io.Copy(io.Discard, s)
			_ = s.SetWriteDeadline(time.Unix(1, 0))
		}()
		saved, err := st.saveState(s)
		switch {
		case errors.Is(err, ErrNoState):
			_, _ = s.Write([]byte{answerNo})
		case errors.Is(err, errSaveStarted):
			// Past the answer byte: the stream ends without a StateSaved.
		case err != nil:
			writeAnswer(s, answerFailed, Failure{Message: err.Error()})
		default:
			b, _ := json.Marshal(saved)
			_, _ = s.Write(b)
		}
		return
	}
	restored, err := st.restoreState(s, h.flags&restoreHeavy != 0)
	// Whatever happened, the executor's side is read to its end: it
	// sends all before it reads.
	_, _ = io.Copy(io.Discard, s)
	if err != nil {
		writeAnswer(s, answerFailed, Failure{Message: err.Error()})
		return
	}
	writeAnswer(s, answerYes, restored)
}

func writeAnswer(w io.Writer, a byte, v any) {
	b, _ := json.Marshal(v)
	_, _ = w.Write(append([]byte{a}, b...))
}

// lockIdle takes busy once no program runs, waiting at most
// stateBusyWait.
func (st *starter) lockIdle() bool {
	deadline := time.Now().Add(stateBusyWait)
	for !st.busy.TryLock() {
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(10 * time.Millisecond)
	}
	return true
}

// saveState has the kernel write its snapshot and sends it to w: the
// answer byte, the chunks and their end. Once the first byte is written,
// a failure is the stream's end without a StateSaved.
func (st *starter) saveState(w io.Writer) (StateSaved, error) {
	if !st.lockIdle() {
		return StateSaved{}, errBusy
	}
	defer st.busy.Unlock()
	k := st.kernel
	if k == nil || !k.alive() {
		return StateSaved{}, ErrNoState
	}
	ours, theirs, err := statePipe(false)
	if err != nil {
		return StateSaved{}, err
	}
	defer ours.Close()
	if _, err := w.Write([]byte{answerYes}); err != nil {
		theirs.Close()
		return StateSaved{}, fmt.Errorf("%w: %w", errSaveStarted, err)
	}
	m, err := k.keep(map[string]any{"save": true, "preload": st.cfg.Preload}, theirs, func() error {
		err := writeChunks(w, ours)
		if err != nil {
			ours.Close() // the kernel's writes fail: it answers
		}
		return err
	})
	if err != nil {
		return StateSaved{}, fmt.Errorf("%w: %w", errSaveStarted, err)
	}
	saved := StateSaved{Lost: m.Lost, LostCount: m.LostCount, Heavy: m.Heavy, Error: m.Error}
	if m.Saved != nil {
		saved.Saved = *m.Saved
	} else {
		saved.Error = cmp.Or(m.Error, "the kept interpreter did not save")
	}
	return saved, nil
}

// writeChunks copies r to w as chunks, and their end.
func writeChunks(w io.Writer, r io.Reader) error {
	buf := make([]byte, 4+stateChunk)
	for {
		n, err := r.Read(buf[4:])
		if n > 0 {
			binary.BigEndian.PutUint32(buf, uint32(n))
			if _, werr := w.Write(buf[:4+n]); werr != nil {
				return werr
			}
		}
		if errors.Is(err, io.EOF) {
			_, werr := w.Write([]byte{0, 0, 0, 0})
			return werr
		}
		if err != nil {
			return err
		}
	}
}

// restoreState starts a kernel and has it read the snapshot r yields. A
// kernel that fails to is killed: the next cell starts a fresh one.
func (st *starter) restoreState(r io.Reader, heavy bool) (StateRestored, error) {
	if st.zygote != nil && (st.kernel == nil || !st.kernel.alive()) {
		st.zygote.awaitReady(kernelZygoteWait) // as start does, before busy
	}
	if !st.lockIdle() {
		return StateRestored{}, errBusy
	}
	defer st.busy.Unlock()
	if st.kernel != nil && st.kernel.alive() {
		return StateRestored{}, errors.New("the sandbox has a kept interpreter already")
	}
	z := st.zygote
	if z == nil {
		return StateRestored{}, errNoKernel
	}
	z.endAhead() // no process forked ahead may find the kernel
	k, err := startKernel(z, st.cfg.Dir, st.cfg.Env)
	if err != nil {
		return StateRestored{}, err
	}
	ours, theirs, err := statePipe(true)
	if err != nil {
		k.kill()
		return StateRestored{}, err
	}
	defer ours.Close()
	m, err := k.keep(map[string]any{"restore": true}, theirs, func() error {
		err := readChunks(ours, r) // a snapshot without its end is an error
		ours.Close()               // the kernel's end of the snapshot
		return err
	})
	if err == nil && (m.Error != "" || m.Restored == nil) {
		err = errors.New(cmp.Or(m.Error, "the kept interpreter did not restore"))
	}
	if err != nil {
		k.kill()
		return StateRestored{}, err
	}
	st.kernel = k
	if heavy && st.cfg.Preload != "" {
		// The kernel imported what its snapshot names as it read it (numpy
		// and pandas: 0.7 s here); the zygote imports the whole preload
		// now, for the programs that follow. Before the kernel's fork, as
		// a new kernel's first cell has it, the restore waited for the
		// plotting modules too (matplotlib and seaborn: 0.9 s more), and
		// during the restore the import took the core the restore needs.
		if err := z.preload(st.cfg.Preload); err != nil {
			log.Printf("preload: %v", err)
		}
	}
	return StateRestored{Restored: *m.Restored, Lost: m.Lost, LostCount: m.LostCount}, nil
}

// statePipe returns a pipe for a snapshot: theirs, the kernel's end, is
// blocking (as a child expects); ours is served by the runtime's poller.
// write says which end is ours.
func statePipe(write bool) (ours, theirs *os.File, err error) {
	var fds [2]int
	if err := syscall.Pipe2(fds[:], syscall.O_CLOEXEC); err != nil {
		return nil, nil, fmt.Errorf("pipe: %w", err)
	}
	_, _ = unix.FcntlInt(uintptr(fds[0]), unix.F_SETPIPE_SZ, statePipeSize)
	o, t := fds[0], fds[1]
	if write {
		o, t = t, o
	}
	if err := syscall.SetNonblock(o, true); err != nil {
		syscall.Close(o)
		syscall.Close(t)
		return nil, nil, fmt.Errorf("pipe: %w", err)
	}
	return os.NewFile(uintptr(o), "state"), os.NewFile(uintptr(t), "state"), nil
}

// keep sends the kernel a save or restore request with theirs, its end of
// the snapshot's pipe (closed here once sent), runs carry meanwhile, and
// returns the kernel's answer. A kernel that dies meanwhile is killed
// for good.
func (k *kernel) keep(req map[string]any, theirs *os.File, carry func() error) (kernelMessage, error) {
	k.seq++
	req["seq"] = k.seq
	msg, err := json.Marshal(req)
	if err != nil {
		theirs.Close()
		return kernelMessage{}, err
	}
	for len(k.msgs) > 0 {
		<-k.msgs
	}
	err = sendFiles(k.sock, msg, []*os.File{theirs})
	theirs.Close()
	if err != nil {
		return kernelMessage{}, fmt.Errorf("send to the kept interpreter: %w", err)
	}
	carried := make(chan error, 1)
	go func() { carried <- carry() }()
	for {
		select {
		case m := <-k.msgs:
			if m.Seq != k.seq || m.Done != nil {
				continue
			}
			if err := <-carried; err != nil {
				return kernelMessage{}, fmt.Errorf("snapshot: %w", err)
			}
			return m, nil
		case <-k.exit:
			k.kill()
			<-carried
			return kernelMessage{}, errors.New("the kept interpreter died")
		case <-k.gone:
			k.kill()
			<-carried
			return kernelMessage{}, errors.New("the kept interpreter died")
		}
	}
}

// SaveState has the agent write a snapshot of the sandbox's kept
// interpreter to w: ErrNoState when it has none. What w receives is the
// interpreter's own bytes; the snapshot is whole only when no error is
// returned.
func (c *Conn) SaveState(ctx context.Context, w io.Writer) (StateSaved, error) {
	s, err := c.openState(ctx, streamHeader{kind: streamSave})
	if err != nil {
		return StateSaved{}, err
	}
	defer s.Close()
	// Ends a read or write under way; stateErr then closes the stream.
	stop := context.AfterFunc(ctx, func() { _ = s.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	var answer [1]byte
	if _, err := io.ReadFull(s, answer[:]); err != nil {
		return StateSaved{}, stateErr(ctx, s, err)
	}
	switch answer[0] {
	case answerYes:
	case answerNo:
		return StateSaved{}, ErrNoState
	default:
		return StateSaved{}, readFailure(s)
	}
	if err := readChunks(w, s); err != nil {
		return StateSaved{}, stateErr(ctx, s, err)
	}
	var saved StateSaved
	if err := json.NewDecoder(io.LimitReader(s, stateAnswerMax)).Decode(&saved); err != nil {
		return StateSaved{}, stateErr(ctx, s, fmt.Errorf("agent: the snapshot did not end: %w", err))
	}
	if saved.Error != "" {
		return StateSaved{}, fmt.Errorf("agent: %s", saved.Error)
	}
	return saved, nil
}

// readChunks copies a snapshot's chunks from r to w, up to their end.
func readChunks(w io.Writer, r io.Reader) error {
	buf := make([]byte, stateChunk)
	var hdr [4]byte
	for {
		if _, err := io.ReadFull(r, hdr[:]); err != nil {
			return err
		}
		n := binary.BigEndian.Uint32(hdr[:])
		if n == 0 {
			return nil
		}
		if n > stateChunk {
			return fmt.Errorf("agent: snapshot chunk of %d bytes", n)
		}
		if _, err := io.ReadFull(r, buf[:n]); err != nil {
			return err
		}
		if _, err := w.Write(buf[:n]); err != nil {
			return err
		}
	}
}

// RestoreState has the agent start a kept interpreter from the snapshot r
// yields; heavy says the saved one had the data stack imported. The
// sandbox must have no kept interpreter.
func (c *Conn) RestoreState(ctx context.Context, r io.Reader, heavy bool) (StateRestored, error) {
	h := streamHeader{kind: streamRestore}
	if heavy {
		h.flags = restoreHeavy
	}
	s, err := c.openState(ctx, h)
	if err != nil {
		return StateRestored{}, err
	}
	defer s.Close()
	// Ends a read or write under way; stateErr then closes the stream.
	stop := context.AfterFunc(ctx, func() { _ = s.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	if err := writeChunks(s, r); err != nil {
		// Without the chunks' end the agent restores nothing.
		return StateRestored{}, stateErr(ctx, s, err)
	}
	if err := s.Close(); err != nil { // our side: the snapshot's end
		return StateRestored{}, stateErr(ctx, s, err)
	}
	var answer [1]byte
	if _, err := io.ReadFull(s, answer[:]); err != nil {
		return StateRestored{}, stateErr(ctx, s, err)
	}
	if answer[0] != answerYes {
		return StateRestored{}, readFailure(s)
	}
	var restored StateRestored
	if err := json.NewDecoder(io.LimitReader(s, stateAnswerMax)).Decode(&restored); err != nil {
		return StateRestored{}, fmt.Errorf("agent: malformed restore answer: %w", err)
	}
	return restored, nil
}

// openState opens a save or restore stream.
func (c *Conn) openState(ctx context.Context, h streamHeader) (*yamux.Stream, error) {
	sess := c.mux.session()
	if sess == nil {
		return nil, ErrNoStreams
	}
	s, err := sess.OpenStream()
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrNoStreams, err)
	}
	if _, err := s.Write(h.encode()); err != nil {
		s.Close()
		return nil, stateErr(ctx, s, err)
	}
	return s, nil
}

// readFailure reads an agent's Failure, as an error.
func readFailure(r io.Reader) error {
	var f Failure
	if err := json.NewDecoder(io.LimitReader(r, stateAnswerMax)).Decode(&f); err != nil || f.Message == "" {
		return errors.New("agent: the snapshot failed")
	}
	return fmt.Errorf("agent: %s", f.Message)
}

// stateErr prefers the context's error to the stream's it caused. Once
// the context is done, the stream is abandoned before the caller goes on:
// the agent then learns it before any frame sent later (a run's, which
// would wait for the snapshot to end).
func stateErr(ctx context.Context, s *yamux.Stream, err error) error {
	if ctx.Err() != nil {
		// Close alone would end only our side: reads would go on.
		_ = s.SetDeadline(time.Unix(1, 0))
		s.Close()
		return ctx.Err()
	}
	return err
}
