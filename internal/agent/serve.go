package agent

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
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

// zygoteWait bounds how long a run waits for the zygote (starting, or
// preloading for it) before it starts the ordinary way.
const zygoteWait = 15 * time.Second

// drainTimeout bounds the wait for a program's output pipes to close after
// it exited (a background process may hold them).
const drainTimeout = 2 * time.Second

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

	type frame struct {
		typ     byte
		payload []byte
	}
	frames := make(chan frame)
	readErr := make(chan error, 1)
	go func() {
		br := bufio.NewReaderSize(in, chunkSize)
		for {
			typ, payload, err := readFrame(br)
			if err != nil {
				readErr <- err
				return
			}
			switch typ {
			case frameMuxIn: // never waits for the loop below
				streams.mux.feed(payload)
				continue
			case frameReset:
				// Stream frames after this one are the next
				// conversation's: its session starts with the reset's
				// answer.
				streams.mux.close()
			}
			select {
			case frames <- frame{typ, payload}:
			case <-ctx.Done():
				return
			}
		}
	}()

	attrs, err := readAttrs(0)
	if err != nil {
		return fmt.Errorf("read process attributes: %w", err)
	}
	st := &starter{cfg: cfg, waiter: newWaiter(), attrs: attrs}
	st.startZygote()
	st.prestart()
	defer func() {
		// Once the last run's goroutine has made what the next run would
		// start from (it holds busy until then).
		st.busy.Lock()
		defer st.busy.Unlock()
		st.dropPrestarted()
	}()
	defer func() {
		if st.zygote != nil {
			st.zygote.stop()
		}
		if st.template != nil {
			st.template.stop()
		}
	}()
	var cur *process
	exited := make(chan Exit, 1)
	defer func() {
		if cur != nil {
			cur.end()
			<-exited
			close(cur.reported)
		}
		if st.kernel != nil {
			st.kernel.kill()
		}
	}()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case err := <-readErr:
			if errors.Is(err, io.EOF) {
				return nil
			}
			return fmt.Errorf("read frame: %w", err)
		case ex := <-exited:
			err := fw.writeJSON(frameExit, ex)
			close(cur.reported)
			cur = nil
			if err != nil {
				return fmt.Errorf("write exit: %w", err)
			}
		case f := <-frames:
			switch f.typ {
			case frameRun:
				streams.runs.Add(1) // as the executor counts them
				if cur != nil {
					if err := fw.writeJSON(frameFail, Failure{Message: "a program is already running"}); err != nil {
						return err
					}
					continue
				}
				var run Run
				if err := json.Unmarshal(f.payload, &run); err != nil {
					if err := fw.writeJSON(frameFail, Failure{Message: "malformed run request"}); err != nil {
						return err
					}
					continue
				}
				p, err := st.start(run, fw, exited)
				if err != nil {
					if err := fw.writeJSON(frameFail, Failure{Message: err.Error()}); err != nil {
						return err
					}
					continue
				}
				cur = p
			case frameStdin:
				if cur != nil {
					cur.stdin.push(f.payload)
				}
			case frameEOF:
				if cur != nil {
					cur.stdin.close()
				}
			case frameKill:
				if cur != nil {
					cur.stop()
				}
			case frameTerm:
				if cur != nil {
					cur.term()
				}
			case frameReset:
				r := Reset{Reason: "a program is running"}
				if cur == nil {
					r = st.reset()
				}
				streams.mux.open()
				if err := fw.writeJSON(frameReady, r); err != nil {
					return fmt.Errorf("write reset: %w", err)
				}
			}
		}
	}
}

// process is one running program, or a cell of the kept interpreter.
type process struct {
	// mu guards pid and stopped: a compiled run starts its compiler and
	// then its program while a kill may come.
	mu      sync.Mutex
	pid     int // the program (or its compiler); for a cell, its kernel
	stopped bool
	cell    *cell
	done    chan struct{} // closed when the run is over
	// reported is closed once the run's exit is written (or never will
	// be): what the next run starts from is made after that.
	reported chan struct{}
	stdin    *stdinQueue
	spare    func() []int   // pids a sweep must not kill: the zygote, the kernel
	spares   func(int) bool // and those it says: processes forked ahead
	sweep    bool
}

// starter starts programs: the ordinary way, or forked from a zygote.
type starter struct {
	cfg    Config
	waiter waiter
	zygote *zygote // nil without one
	// template spawns zygotes (see zygote.go); nil without a zygote, or
	// after a reset found it changed, until the next zygote starts.
	template *zygote
	// attrs are the agent's process attributes at its start, which the
	// template shares; a reset checks both still have them.
	attrs  procAttrs
	kernel *kernel // the kept interpreter, if one was asked for; under busy
	// next is the pre-started process of the next run (prestart.go), and
	// preloaded says that a program asked for Preload. Both change only
	// while no program runs.
	next      *prestarted
	preloaded bool
	// busy is held from a program's start until nothing of it is left,
	// and by the zygote while it starts: a process is dumpable from its
	// exec until it makes itself not, and no program may be there to
	// trace it or take its descriptors in that moment.
	busy sync.Mutex
}

func (st *starter) start(run Run, fw *frameWriter, exited chan<- Exit) (_ *process, err error) {
	cfg := st.cfg
	if len(cfg.Launch) == 0 {
		return nil, errors.New("agent has no launch command")
	}
	if run.KeepState && st.zygote != nil && (st.kernel == nil || !st.kernel.alive()) {
		// A kernel is forked from the zygote, which may be yet to start:
		// it starts only while no program runs, so wait before taking busy.
		st.zygote.awaitReady(zygoteWait)
	}
	st.busy.Lock()
	defer func() {
		if err != nil {
			st.busy.Unlock()
		}
	}()
	if run.Filesystem != nil && (run.KeepState || len(cfg.Compile) > 0) {
		return nil, errors.New("filesystem rules are for programs the agent starts directly")
	}
	if err := writeProgram(cfg.Scratch, "main."+cfg.Ext, run.Code, cfg.User); err != nil {
		return nil, err
	}
	path := filepath.Join(cfg.Scratch, "main."+cfg.Ext)

	env := mergeEnv(cfg.Env, run.Env)
	oomBefore, oomKnown := int64(0), false
	if cfg.OOMKills != nil {
		oomBefore, oomKnown = cfg.OOMKills()
	}
	var (
		pid                                    int
		wait                                   func() syscall.WaitStatus
		stdinR, stdinW, outR, outW, errR, errW *os.File
		next                                   = st.takePrestarted(run)
		c                                      *cell
		kstate                                 string
		compiled                               = len(cfg.Compile) > 0 && !run.KeepState
		forked                                 *zygote // the zygote the program forked from
		handed                                 *ahead  // its process forked ahead, if it took that
		zygoteReady                            bool    // waited for once: at most zygoteWait
	)
	if cfg.PreloadWhen != nil && cfg.Prestart && cfg.PreloadWhen.MatchString(run.Code) {
		st.preloaded = true // for the programs pre-started from now on
	}
	if z := st.zygote; next == nil && z != nil && !compiled {
		if run.KeepState || run.Filesystem != nil {
			z.endAhead() // not for this program, which must not find it
		} else {
			st.preloadFor(run.Code)
			if zygoteReady = z.waitReady(zygoteWait); zygoteReady {
				handed = z.handAhead(forkRequest{Path: path, Dir: cfg.Dir, Env: env})
			}
		}
	}
	switch {
	case next != nil:
		stdinW, outR, errR = next.stdinW, next.outR, next.errR
		pid, wait = next.pid, func() syscall.WaitStatus { return <-next.ended }
		go next.feed(run.Code)
	case handed != nil:
		stdinW, outR, errR = handed.stdinW, handed.outR, handed.errR
		pid, wait, forked = handed.pid, handed.wait, st.zygote
	default:
		if stdinR, stdinW, outR, outW, errR, errW, err = pipes(); err != nil {
			return nil, err
		}
	}

	switch {
	case next != nil || handed != nil:
		// Running already.
	case compiled:
		// Its phases start from the goroutine below, which closes the
		// child's ends of the pipes once the program has them.
	case run.KeepState:
		c, kstate, err = st.startCell(run, path, env, [3]*os.File{stdinR, outW, errW})
		if err == nil {
			pid = c.k.pid
		}
	case zygoteReady:
		// None forked ahead (or it died): forked now.
		f, ferr := st.zygote.fork(forkRequest{Path: path, Dir: cfg.Dir, Env: env}, []*os.File{stdinR, outW, errW})
		if ferr == nil {
			pid, wait, forked = f.pid, func() syscall.WaitStatus { return <-f.exit }, st.zygote
		}
	}
	if wait == nil && !run.KeepState && !compiled {
		argv := expand(cfg.Launch, path, "")
		if run.Filesystem != nil {
			argv, err = landlockCommand(run.Filesystem, argv)
			if err != nil {
				closeAll(stdinR, stdinW, outR, outW, errR, errW)
				return nil, err
			}
		}
		cmd := exec.Command(argv[0], argv[1:]...)
		cmd.Dir = cfg.Dir
		cmd.Env = env
		cmd.Stdin, cmd.Stdout, cmd.Stderr = stdinR, outW, errW
		// Its own session, so that killing the group reaches what it started.
		cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Credential: cfg.User}
		var ended <-chan syscall.WaitStatus
		ended, err = st.waiter.start(cmd)
		if err == nil {
			pid = cmd.Process.Pid
			wait = func() syscall.WaitStatus { return <-ended }
		}
	}
	if !compiled {
		closeAll(stdinR, outW, errW) // the child holds its own copies
	}
	if err != nil {
		closeAll(stdinW, outR, errR)
		return nil, fmt.Errorf("start program: %w", err)
	}

	p := &process{pid: pid, cell: c, done: make(chan struct{}), reported: make(chan struct{}), stdin: newStdinQueue(stdinW), sweep: cfg.ownsSandbox()}
	p.spare = func() []int {
		pids := st.templatePIDs()
		if st.zygote != nil {
			pids = append(pids, st.zygote.processID())
		}
		if st.kernel != nil {
			pids = append(pids, st.kernel.pid)
		}
		return pids
	}
	p.spares = func(pid int) bool { return st.zygote != nil && st.zygote.spares(pid) }
	var wg sync.WaitGroup
	wg.Add(2)
	lineWait := cmp.Or(cfg.LineWait, DefaultLineWait)
	go relay(&wg, outR, frameStdout, fw, lineWait)
	go relay(&wg, errR, frameStderr, fw, lineWait)
	go p.stdin.run()

	go func() {
		var ws syscall.WaitStatus
		lost, phase := false, ""
		if compiled {
			ws, phase = st.compiledRun(p, run, env, [3]*os.File{stdinR, outW, errW})
		} else if c != nil {
			ws, lost = c.wait()
			if lost {
				st.kernel = nil
			}
		} else {
			ws = wait()
		}
		close(p.done)
		// The program is gone; take what it left running with it, which
		// also closes the pipes those processes held.
		clean := p.kill()
		p.stdin.close()
		drained := make(chan struct{})
		go func() { wg.Wait(); close(drained) }()
		select {
		case <-drained:
		case <-time.After(drainTimeout):
			closeAll(outR, errR)
			<-drained
		}
		ex := Exit{ExitCode: ws.ExitStatus(), Clean: clean, Kernel: kstate, StateLost: lost, Phase: phase}
		if ws.Signaled() {
			ex.ExitCode, ex.Signal = -1, int(ws.Signal())
		}
		if oomKnown {
			if n, ok := cfg.OOMKills(); ok && n > oomBefore {
				ex.OOMKilled = true
			}
		}
		exited <- ex
		// What the next run starts from, made after the sweep (no program
		// runs) and off this run's time: once its exit is reported (the
		// agent runs on one thread, see cmd/runbox-agent), and the next
		// run waits for busy.
		<-p.reported
		st.prestart()
		if forked != nil {
			forked.forkAhead()
		}
		st.busy.Unlock()
	}()
	return p, nil
}

// preloadFor has the zygote import the heavy modules once a program needs
// them: the program waits while it does, then forks with them, as every
// later one will.
func (st *starter) preloadFor(code string) {
	z, cfg := st.zygote, st.cfg
	if z != nil && cfg.Preload != "" && cfg.PreloadWhen != nil && cfg.PreloadWhen.MatchString(code) && z.waitReady(zygoteWait) {
		if err := z.preload(cfg.Preload); err != nil {
			log.Printf("preload: %v", err)
		}
	}
}

// startCell runs a kept-state run in the kernel, starting one if there is
// none (or it died): the kernel is forked from the zygote, after the
// preload the code calls for, so that it begins with the data stack
// imported. It returns the cell and KernelNew or KernelKept.
func (st *starter) startCell(run Run, path string, env []string, stdio [3]*os.File) (*cell, string, error) {
	state := KernelKept
	if st.kernel != nil && !st.kernel.alive() {
		st.kernel.kill()
		st.kernel = nil
	}
	if st.kernel == nil {
		st.preloadFor(run.Code)
		k, err := startKernel(st.zygote, st.cfg.Dir, env)
		if err != nil {
			return nil, "", err
		}
		st.kernel, state = k, KernelNew
	}
	c, err := st.kernel.run(path, run.Env, stdio)
	if err != nil {
		st.kernel.kill()
		st.kernel = nil
		return nil, "", err
	}
	return c, state, nil
}

// writeProgram writes a program's source for its launcher. The folder is
// in /tmp, which programs own: whatever an earlier one left there — a
// link in place of the folder or the file, a FIFO that would block the
// write — is removed, and the file made anew without following links.
// With owner (programs run as another user than the agent) both are given
// to owner, as if a program had made them (a launcher may write beside
// the file).
func writeProgram(dir, name, code string, owner *syscall.Credential) error {
	if fi, err := os.Lstat(dir); err == nil && !fi.IsDir() {
		_ = os.Remove(dir)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return fmt.Errorf("prepare scratch folder: %w", err)
	}
	path := filepath.Join(dir, name)
	if err := os.RemoveAll(path); err != nil {
		return fmt.Errorf("write program: %w", err)
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL|syscall.O_NOFOLLOW, 0o600)
	if err != nil {
		return fmt.Errorf("write program: %w", err)
	}
	_, err = f.WriteString(code)
	if owner != nil && err == nil {
		if err = os.Chown(dir, int(owner.Uid), int(owner.Gid)); err == nil {
			err = f.Chown(int(owner.Uid), int(owner.Gid))
		}
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("write program: %w", err)
	}
	return nil
}

// launch starts cmd as the run's current process, unless the run was
// stopped.
func (p *process) launch(w waiter, cmd *exec.Cmd) (<-chan syscall.WaitStatus, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.stopped {
		return nil, errStopped
	}
	ended, err := w.start(cmd)
	if err != nil {
		return nil, err
	}
	p.pid = cmd.Process.Pid
	return ended, nil
}

// stop is what a kill frame does: a program is killed with what it
// started; a cell is interrupted, and its kernel killed if it does not
// stop in time.
func (p *process) stop() {
	if p.cell != nil {
		p.cell.k.interrupt(p.done)
		return
	}
	p.kill()
}

// term is what a term frame does: the program's process group gets
// SIGTERM, to end as it will; a cell is interrupted, as by stop.
func (p *process) term() {
	if p.cell != nil {
		p.cell.k.interrupt(p.done)
		return
	}
	p.mu.Lock()
	pid, stopped := p.pid, p.stopped
	p.mu.Unlock()
	if pid > 0 && !stopped {
		_ = syscall.Kill(-pid, syscall.SIGTERM)
	}
}

// end kills the run outright, a cell's kernel included.
func (p *process) end() {
	if p.cell != nil {
		p.cell.k.kill()
	}
	p.kill()
}

// kill ends the program's process group (a cell's kernel is spared) and,
// when sweeping, every other process in the sandbox but init, the agent,
// the zygote and the kernel. It reports whether the sandbox was then found
// to hold nothing else. No phase of the run starts after it.
func (p *process) kill() bool {
	p.mu.Lock()
	p.stopped = true
	pid := p.pid
	p.mu.Unlock()
	if p.cell == nil && pid > 0 {
		_ = syscall.Kill(-pid, syscall.SIGKILL)
	}
	if !p.sweep {
		return false
	}
	return sweep(p.spare(), p.spares)
}

// sweepTime bounds how long a sweep keeps killing before it gives up and
// reports the sandbox unclean.
const sweepTime = 2 * time.Second

// sweep kills every process it may, other than init, the agent itself,
// spare and those spares (if set) says (only in a sandbox the agent owns:
// Config.ownsSandbox), and scans again until a scan finds none alive: a process can fork
// between a scan and its kill (a fork loop, a double fork under way), but
// a killed one cannot, so the scans converge. It reports whether they did
// in time. Zombies are dead already (their parent, the agent or the
// zygote, reaps them).
func sweep(spare []int, spares func(int) bool) bool {
	self := os.Getpid()
	deadline := time.Now().Add(sweepTime)
	for pause := 100 * time.Microsecond; ; pause = min(2*pause, 10*time.Millisecond) {
		entries, err := os.ReadDir("/proc")
		if err != nil {
			return false
		}
		found := false
		for _, e := range entries {
			pid, err := strconv.Atoi(e.Name())
			// spares before alive: it spares the processes forked ahead
			// without alive's read of /proc (0.1 ms each under gVisor), and
			// reads /proc itself only while a fork ahead is pending.
			if err != nil || pid == 1 || pid == self || slices.Contains(spare, pid) || (spares != nil && spares(pid)) || !alive(pid) {
				continue
			}
			found = true
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
		if !found {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(pause)
	}
}

// alive reports whether a process exists and is not a zombie.
func alive(pid int) bool {
	state, _, ok := procStat(pid)
	return ok && state != 'Z' && state != 'X'
}

// procStat reads process pid's state and parent from /proc; ok is false
// when it cannot be read (the process is gone). Fields it cannot make out
// are 0.
func procStat(pid int) (state byte, ppid int, ok bool) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, 0, false
	}
	// The state and the parent follow the command name, which may hold
	// anything but ends at the last ')'.
	fields := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
	if len(fields) > 0 {
		state = fields[0][0]
	}
	if len(fields) > 1 {
		ppid, _ = strconv.Atoi(fields[1])
	}
	return state, ppid, true
}

// DefaultLineWait is how long relay waits for the rest of a line:
// unbuffered programs write a line in pieces (Python's print writes the
// text, then the newline), and a client should see the line as one chunk.
const DefaultLineWait = 2 * time.Millisecond

// relay copies a program's output into frames until the pipe closes.
func relay(wg *sync.WaitGroup, r *os.File, typ byte, fw *frameWriter, lineWait time.Duration) {
	defer wg.Done()
	defer r.Close()
	buf := make([]byte, chunkSize)
	for {
		n, err := r.Read(buf)
		// Gather the rest of an unfinished line for a moment.
		for err == nil && n > 0 && n < len(buf) && buf[n-1] != '\n' {
			if r.SetReadDeadline(time.Now().Add(lineWait)) != nil {
				break
			}
			var m int
			m, err = r.Read(buf[n:])
			n += m
			if errors.Is(err, os.ErrDeadlineExceeded) {
				err = nil
				break
			}
		}
		_ = r.SetReadDeadline(time.Time{})
		if n > 0 {
			if fw.write(typ, buf[:n]) != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// mergeEnv overlays a run's variables on the base environment.
func mergeEnv(base []string, extra map[string]string) []string {
	env := make([]string, 0, len(base)+len(extra))
	for _, kv := range base {
		k, _, _ := strings.Cut(kv, "=")
		if _, ok := extra[k]; !ok {
			env = append(env, kv)
		}
	}
	for k, v := range extra {
		env = append(env, k+"="+v)
	}
	return env
}

// pipes makes a program's stdin, stdout and stderr pipes.
func pipes() (stdinR, stdinW, outR, outW, errR, errW *os.File, err error) {
	if stdinR, stdinW, err = os.Pipe(); err != nil {
		return
	}
	if outR, outW, err = os.Pipe(); err != nil {
		closeAll(stdinR, stdinW)
		return
	}
	if errR, errW, err = os.Pipe(); err != nil {
		closeAll(stdinR, stdinW, outR, outW)
	}
	return
}

func closeAll(files ...*os.File) {
	for _, f := range files {
		_ = f.Close()
	}
}

// maxQueuedStdin bounds the input the agent holds for a program that does
// not read it. The executor sends no more than its own budget; past this,
// the rest is dropped and the program's input ends.
const maxQueuedStdin = 8 << 20

// stdinQueue feeds a program's stdin without ever blocking the frame loop:
// a program that does not read its input must not stop the agent from
// hearing a kill.
type stdinQueue struct {
	w      *os.File
	mu     sync.Mutex
	cond   *sync.Cond
	chunks [][]byte
	queued int
	closed bool
}

func newStdinQueue(w *os.File) *stdinQueue {
	q := &stdinQueue{w: w}
	q.cond = sync.NewCond(&q.mu)
	return q
}

func (q *stdinQueue) push(p []byte) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed {
		return
	}
	if q.queued+len(p) > maxQueuedStdin {
		log.Printf("stdin: more than %d bytes the program has not read; its input ends here", maxQueuedStdin)
		q.closed = true
	} else {
		q.chunks = append(q.chunks, p)
		q.queued += len(p)
	}
	q.cond.Signal()
}

// close ends the input once what was queued is written.
func (q *stdinQueue) close() {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.closed = true
	q.cond.Signal()
}

func (q *stdinQueue) run() {
	defer q.w.Close()
	for {
		q.mu.Lock()
		for len(q.chunks) == 0 && !q.closed {
			q.cond.Wait()
		}
		if len(q.chunks) == 0 {
			q.mu.Unlock()
			return
		}
		chunk := q.chunks[0]
		q.chunks = q.chunks[1:]
		q.queued -= len(chunk)
		q.mu.Unlock()
		if _, err := q.w.Write(chunk); err != nil {
			return // the program closed its stdin or exited
		}
	}
}

// CgroupOOMKills reads the OOM-kill counter of the sandbox's memory cgroup
// (v1 or v2).
func CgroupOOMKills() (int64, bool) {
	for _, f := range []string{"/sys/fs/cgroup/memory/memory.oom_control", "/sys/fs/cgroup/memory.events"} {
		b, err := os.ReadFile(f)
		if err != nil {
			continue
		}
		for line := range strings.SplitSeq(string(b), "\n") {
			if v, ok := strings.CutPrefix(line, "oom_kill "); ok {
				n, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
				return n, err == nil
			}
		}
	}
	return 0, false
}
