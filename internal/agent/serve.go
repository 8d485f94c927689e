package agent

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"os"
	"regexp"
	"syscall"
	"time"
)

// Config says how the agent runs programs.
type Config struct {
	// Launch is the command that runs a program; the program's path is
	// appended to it.
	Launch []string
	// Ext is the file extension the program is written with (no dot).
	Ext string
	// Dir is the program's working directory.
	Dir string
	// Scratch is where the program file is written.
	Scratch string
	// Sweep kills every other process of the sandbox after each run, so that
	// nothing a program left in the background outlives it. Only for an agent
	// that owns its whole process namespace.
	Sweep bool
	// Env is the environment a program starts with, before the run's own.
	Env []string
	// OOMKills returns how many times the OOM killer has fired in the
	// sandbox; nil when unknown.
	OOMKills func() (int64, bool)
	// LineWait is how long output that ends mid-line is held for the rest
	// of the line (DefaultLineWait if 0).
	LineWait time.Duration
	// Zygote, when set, is the command of a zygote that forks programs
	// (see zygote.go); it is started with the agent.
	Zygote []string
	// Preload names modules the zygote imports once a program matches
	// PreloadWhen, so that later programs find them imported.
	Preload     string
	PreloadWhen *regexp.Regexp
	// Skel is a folder copied into Scratch's parent (/tmp) at start and
	// after every reset (caches), if set.
	Skel string
	// Wipe names the folders a reset empties: every one a program can
	// write to but /data (/tmp, /dev/shm, /dev/mqueue, ExecDir).
	Wipe []string
	// Proxy is where the proxy listener listens (ProxyAddr); none if
	// empty. What connects to it reaches the executor through the
	// executor's socket at ProxySocket where that can be reached
	// (proxysocket.go), else as a proxy stream.
	Proxy       string
	ProxySocket string
	// User, when set, is the user programs, the zygote and its template
	// run as, not the agent's own: under a kernel that shows a
	// non-dumpable process's descriptors to processes of its user
	// (gVisor), only another user keeps the agent's out of their reach.
	// The agent then runs as root with the few capabilities this takes.
	User *syscall.Credential
	// Compile, when set, is the command that builds a program before it
	// runs (compile.go): {src} stands for the program's file name in
	// Scratch, its working directory, and {out} for the folder it writes
	// to, which Launch then names as {out}.
	Compile []string
	// ExecDir is the folder programs may execute files from (/tmp is
	// noexec), where compiled programs are cached.
	ExecDir string
	// Prestart starts each run's process before the run comes
	// (prestart.go), in /: Launch with {src} (or the appended path)
	// standing for /dev/fd/3, where the run writes its source. Prelude,
	// if set, is written there first, then Preload once a program
	// matched PreloadWhen.
	Prestart bool
	Prelude  string
	// DataSum has each Exit carry a fingerprint of Dir (datasum.go): an
	// engine that copies Dir out of the sandbox after each run
	// (Kubernetes: a pod shares no folder with the executor) skips the
	// copy when nothing in Dir changed.
	DataSum bool
	// Quota, when set, has the agent measure Dir as each run goes and
	// stop a program whose files pass it (quota.go): an engine that
	// copies Dir out of the sandbox after each run (Kubernetes) has no
	// executor measure it meanwhile.
	Quota Quota
}

// ownsSandbox reports whether the agent may kill every other process it
// sees and empty the folders programs write to: it runs as the programs'
// user, or apart from them as the init of a sandbox — never as root
// among a host's processes (a test, say).
func (cfg Config) ownsSandbox() bool {
	if !cfg.Sweep {
		return false
	}
	if cfg.User != nil {
		return os.Getpid() == 1
	}
	return os.Getuid() != 0
}

// programUID is the uid programs run as.
func (cfg Config) programUID() int {
	if cfg.User != nil {
		return int(cfg.User.Uid)
	}
	return os.Getuid()
}

// Serve speaks the protocol on in and out until in ends or ctx is done. It
// runs one program at a time.
func Serve(ctx context.Context, cfg Config, in io.Reader, out io.Writer) error {
	fw := newFrameWriter(out)
	if err := fw.writeJSON(frameHello, Hello{Version: Version}); err != nil {
		return fmt.Errorf("write hello: %w", err)
	}
	streams := newStreamServer(fw)
	streams.socket = cfg.ProxySocket
	streams.mux.open()
	defer streams.mux.close()
	if cfg.Proxy != "" {
		ln, err := streams.listenProxy(cfg.Proxy)
		if err != nil {
			log.Printf("proxy listener: %v", err)
		} else {
			defer ln.Close()
		}
	}
	frames, readErr := readFrames(ctx, in, &streams.mux)

	attrs, err := readAttrs(0)
	if err != nil {
		return fmt.Errorf("read process attributes: %w", err)
	}
	st := &starter{cfg: cfg, waiter: newWaiter(), attrs: attrs}
	streams.state.Store(st)
	st.startZygote()
	st.prestart()
	defer st.stop()
	l := &loop{fw: fw, streams: streams, st: st, exited: make(chan Exit, 1)}
	defer l.end()
	return l.run(ctx, frames, readErr)
}

// frame is a frame the loop handles.
type frame struct {
	typ     byte
	payload []byte
}

// readFrames reads frames from in until it ends (the error then comes on
// readErr) or ctx is done. Stream frames go to mux at once, never waiting
// for the loop; the others come on frames.
func readFrames(ctx context.Context, in io.Reader, mux *muxEnd) (frames <-chan frame, readErr <-chan error) {
	fc := make(chan frame)
	ec := make(chan error, 1)
	go func() {
		br := bufio.NewReaderSize(in, chunkSize)
		for {
			typ, payload, err := readFrame(br)
			if err != nil {
				ec <- err
				return
			}
			switch typ {
			case frameMuxIn: // never waits for the loop
				mux.feed(payload)
				continue
			case frameReset:
				// Stream frames after this one are the next
				// conversation's: its session starts with the reset's
				// answer.
				mux.close()
			}
			select {
			case fc <- frame{typ, payload}:
			case <-ctx.Done():
				return
			}
		}
	}()
	return fc, ec
}

// loop is Serve's frame loop: it starts runs, feeds and stops the current
// one, reports its exit and resets the sandbox between runs.
type loop struct {
	fw      *frameWriter
	streams *streamServer
	st      *starter
	cur     *process // the current run; nil between runs
	exited  chan Exit
	// watch measures the current run's folder (Config.Quota); passed is
	// its signal, nil once taken.
	watch  *dataWatch
	passed <-chan struct{}
}

func (l *loop) run(ctx context.Context, frames <-chan frame, readErr <-chan error) error {
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case err := <-readErr:
			if errors.Is(err, io.EOF) {
				return nil
			}
			return fmt.Errorf("read frame: %w", err)
		case <-l.passed:
			// The run's files passed their quota: its program is stopped
			// as a kill frame stops it, and its exit says why.
			l.passed = nil
			l.cur.stop()
		case ex := <-l.exited:
			if l.watch != nil {
				ex.Quota = l.watch.stop()
				l.watch, l.passed = nil, nil
			}
			// Past its quota, the engine takes nothing of the folder.
			if l.st.cfg.DataSum && ex.Quota == "" {
				ex.DataSum = dataSum(l.st.cfg.Dir)
			}
			err := l.fw.writeJSON(frameExit, ex)
			close(l.cur.reported)
			l.cur = nil
			if err != nil {
				return fmt.Errorf("write exit: %w", err)
			}
		case f := <-frames:
			if err := l.handle(f); err != nil {
				return err
			}
		}
	}
}

// handle handles a frame of the executor's; an error ends the loop.
func (l *loop) handle(f frame) error {
	switch f.typ {
	case frameRun:
		return l.start(f.payload)
	case frameStdin:
		if l.cur != nil {
			l.cur.stdin.push(f.payload)
		}
	case frameEOF:
		if l.cur != nil {
			l.cur.stdin.close()
		}
	case frameKill:
		if l.cur != nil {
			l.cur.stop()
		}
	case frameTerm:
		if l.cur != nil {
			l.cur.term()
		}
	case frameReset:
		r := Reset{Reason: "a program is running"}
		if l.cur == nil {
			r = l.st.reset()
		}
		l.streams.mux.open()
		if err := l.fw.writeJSON(frameReady, r); err != nil {
			return fmt.Errorf("write reset: %w", err)
		}
	}
	return nil
}

// start starts the run a run frame asks for, or answers why it did not.
func (l *loop) start(payload []byte) error {
	l.streams.runs.Add(1) // as the executor counts them
	if l.cur != nil {
		return l.fw.writeJSON(frameFail, Failure{Message: "a program is already running"})
	}
	var run Run
	if err := json.Unmarshal(payload, &run); err != nil {
		return l.fw.writeJSON(frameFail, Failure{Message: "malformed run request"})
	}
	var watch *dataWatch
	if q := l.st.cfg.Quota; q.set() {
		watch = watchData(l.st.cfg.Dir, q)
	}
	p, err := l.st.start(run, l.fw, l.exited)
	if err != nil {
		if watch != nil {
			watch.stop()
		}
		return l.fw.writeJSON(frameFail, Failure{Message: err.Error()})
	}
	l.cur = p
	if watch != nil {
		l.watch, l.passed = watch, watch.passed
	}
	return nil
}

// end ends the current run, if any, and the kept interpreter, as Serve
// returns.
func (l *loop) end() {
	if l.watch != nil {
		l.watch.stop()
	}
	if l.cur != nil {
		l.cur.end()
		<-l.exited
		close(l.cur.reported)
	}
	if l.st.kernel != nil {
		l.st.kernel.kill()
	}
}
