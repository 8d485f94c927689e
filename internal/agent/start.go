package agent

import (
	"cmp"
	"errors"
	"fmt"
	"log"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

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

// zygoteWait bounds how long a run waits for the zygote (starting, or
// preloading for it) before it starts the ordinary way.
const zygoteWait = 15 * time.Second

// kernelZygoteWait bounds how long a kept-state cell waits for the
// zygote, which it cannot do without: longer than a run that has another
// way to start, since importing the data stack on a loaded host took over
// 15 s (CI); the run's own timeout, kept by the executor, still holds.
const kernelZygoteWait = time.Minute

// drainTimeout bounds the wait for a program's output pipes to close after
// it exited (a background process may hold them).
const drainTimeout = 2 * time.Second

// start starts a run's program and returns it running; exited receives its
// exit. The starter's busy is held from here until nothing of the program
// is left.
func (st *starter) start(run Run, fw *frameWriter, exited chan<- Exit) (_ *process, err error) {
	cfg := st.cfg
	if len(cfg.Launch) == 0 {
		return nil, errors.New("agent has no launch command")
	}
	if run.KeepState && st.zygote != nil && (st.kernel == nil || !st.kernel.alive()) {
		// A kernel is forked from the zygote, which may be yet to start:
		// it starts only while no program runs, so wait before taking busy.
		st.zygote.awaitReady(kernelZygoteWait)
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
	if run.Trust != "" {
		if run.Env, err = withTrust(cfg.Scratch, run, SystemRoots, cfg.User); err != nil {
			return nil, err
		}
	}

	env := mergeEnv(cfg.Env, run.Env)
	oomKilled := oomSince(cfg.OOMKills)
	l, err := st.startProgram(run, path, env)
	if err != nil {
		return nil, err
	}

	p := &process{pid: l.pid, cell: l.cell, done: make(chan struct{}), reported: make(chan struct{}), stdin: newStdinQueue(l.stdinW), sweep: cfg.ownsSandbox()}
	p.spare = st.sparePIDs
	p.spares = func(pid int) bool { return st.zygote != nil && st.zygote.spares(pid) }
	var output sync.WaitGroup
	output.Add(2)
	lineWait := cmp.Or(cfg.LineWait, DefaultLineWait)
	go relay(&output, l.outR, frameStdout, fw, lineWait)
	go relay(&output, l.errR, frameStderr, fw, lineWait)
	go p.stdin.run()
	go st.finish(p, run, env, l, &output, exited, oomKilled)
	return p, nil
}

// launched is a run's program as started.
type launched struct {
	pid  int
	wait func() syscall.WaitStatus // nil for a cell and a compiled run
	// stdinW, outR and errR are the agent's ends of the program's stdio.
	stdinW, outR, errR *os.File
	// compiled says the program is built and run in phases (compile.go),
	// from the goroutine that waits for it, on child: the program's ends
	// of the pipes, which the phases close once the program has them.
	compiled bool
	child    [3]*os.File
	cell     *cell
	kstate   string  // KernelNew or KernelKept, for a cell
	forked   *zygote // the zygote the program forked from
}

// startProgram starts a run's program the first way that applies: its
// process pre-started (prestart.go), forked ahead by the zygote, a cell of
// the kept interpreter, forked by the zygote now, or executed. A compiled
// run's phases start later (finish).
func (st *starter) startProgram(run Run, path string, env []string) (*launched, error) {
	cfg := st.cfg
	l := &launched{compiled: len(cfg.Compile) > 0 && !run.KeepState}
	next := st.takePrestarted(run)
	if cfg.PreloadWhen != nil && cfg.Prestart && cfg.PreloadWhen.MatchString(run.Code) {
		st.preloaded = true // for the programs pre-started from now on
	}
	var handed *ahead    // its process forked ahead, if it took that
	zygoteReady := false // waited for once: at most zygoteWait
	if z := st.zygote; next == nil && z != nil && !l.compiled {
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
		l.stdinW, l.outR, l.errR = next.stdinW, next.outR, next.errR
		l.pid, l.wait = next.pid, func() syscall.WaitStatus { return <-next.ended }
		go next.feed(run.Code)
		return l, nil
	case handed != nil:
		l.stdinW, l.outR, l.errR = handed.stdinW, handed.outR, handed.errR
		l.pid, l.wait, l.forked = handed.pid, handed.wait, st.zygote
		return l, nil
	}
	argv := expand(cfg.Launch, path, "")
	if run.Filesystem != nil {
		// Never forked by the zygote, nor a cell or compiled: executed.
		var err error
		if argv, err = landlockCommand(run.Filesystem, argv); err != nil {
			return nil, err
		}
	}
	stdinR, stdinW, outR, outW, errR, errW, err := pipes()
	if err != nil {
		return nil, err
	}
	l.stdinW, l.outR, l.errR = stdinW, outR, errR
	child := [3]*os.File{stdinR, outW, errW}
	if l.compiled {
		l.child = child
		return l, nil
	}
	err = st.startOnPipes(run, l, forkRequest{Path: path, Dir: cfg.Dir, Env: env}, argv, child, zygoteReady)
	closeAll(child[:]...) // the child holds its own copies
	if err != nil {
		closeAll(stdinW, outR, errR)
		return nil, fmt.Errorf("start program: %w", err)
	}
	return l, nil
}

// startOnPipes starts a program on child, its ends of new pipes: as a cell
// of the kept interpreter for a kept-state run, else forked by the zygote
// if it was found ready, else (or if that fork fails) executed as argv.
func (st *starter) startOnPipes(run Run, l *launched, fr forkRequest, argv []string, child [3]*os.File, zygoteReady bool) error {
	if run.KeepState {
		c, kstate, err := st.startCell(run, fr.Path, fr.Env, child)
		if err != nil {
			return err
		}
		l.pid, l.cell, l.kstate = c.k.pid, c, kstate
		return nil
	}
	if zygoteReady {
		// None forked ahead (or it died): forked now.
		if f, err := st.zygote.fork(fr, child[:]); err == nil {
			l.pid, l.wait, l.forked = f.pid, func() syscall.WaitStatus { return <-f.exit }, st.zygote
			return nil
		}
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Dir = fr.Dir
	cmd.Env = fr.Env
	cmd.Stdin, cmd.Stdout, cmd.Stderr = child[0], child[1], child[2]
	// Its own session, so that killing the group reaches what it started.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Credential: st.cfg.User}
	ended, err := st.waiter.start(cmd)
	if err != nil {
		return err
	}
	l.pid, l.wait = cmd.Process.Pid, func() syscall.WaitStatus { return <-ended }
	return nil
}

// sparePIDs are the pids a sweep must not kill: the template, the zygote
// and the kernel.
func (st *starter) sparePIDs() []int {
	pids := st.templatePIDs()
	if st.zygote != nil {
		pids = append(pids, st.zygote.processID())
	}
	if st.kernel != nil {
		pids = append(pids, st.kernel.pid)
	}
	return pids
}

// finish waits for a run's program to end, takes what it left running,
// and sends its exit on exited once its output is relayed (output). Then,
// once the exit is reported, it makes what the next run starts from and
// lets the next run start.
func (st *starter) finish(p *process, run Run, env []string, l *launched, output *sync.WaitGroup, exited chan<- Exit, oomKilled func() bool) {
	var ws syscall.WaitStatus
	lost, phase := false, ""
	if l.compiled {
		ws, phase = st.compiledRun(p, run, env, l.child)
	} else if l.cell != nil {
		ws, lost = l.cell.wait()
		if lost {
			st.kernel = nil
		}
	} else {
		ws = l.wait()
	}
	close(p.done)
	// The program is gone; take what it left running with it, which
	// also closes the pipes those processes held.
	clean := p.kill()
	p.stdin.close()
	drain(output, l.outR, l.errR)
	ex := Exit{ExitCode: ws.ExitStatus(), Clean: clean, Kernel: l.kstate, StateLost: lost, Phase: phase}
	if ws.Signaled() {
		ex.ExitCode, ex.Signal = -1, int(ws.Signal())
	}
	if oomKilled() {
		ex.OOMKilled = true
	}
	exited <- ex
	// What the next run starts from, made after the sweep (no program
	// runs) and off this run's time: once its exit is reported (the
	// agent runs on one thread, see cmd/runbox-agent), and the next
	// run waits for busy.
	<-p.reported
	st.prestart()
	if l.forked != nil {
		l.forked.forkAhead()
	}
	st.busy.Unlock()
}

// drain waits for the relays of a program's output to end, at most
// drainTimeout: then it closes the pipes under them (a background process
// may hold them).
func drain(relays *sync.WaitGroup, pipes ...*os.File) {
	drained := make(chan struct{})
	go func() { relays.Wait(); close(drained) }()
	select {
	case <-drained:
	case <-time.After(drainTimeout):
		closeAll(pipes...)
		<-drained
	}
}

// oomSince returns what reports whether the OOM killer has fired since
// now, as count (Config.OOMKills) tells; always false when it cannot.
func oomSince(count func() (int64, bool)) func() bool {
	if count == nil {
		return func() bool { return false }
	}
	before, known := count()
	return func() bool {
		if !known {
			return false
		}
		n, ok := count()
		return ok && n > before
	}
}

// stop stops the zygote and its template, then drops what the next run
// would have started from, once the last run's goroutine has made it (it
// holds busy until then).
func (st *starter) stop() {
	if st.zygote != nil {
		st.zygote.stop()
	}
	if st.template != nil {
		st.template.stop()
	}
	st.busy.Lock()
	defer st.busy.Unlock()
	st.dropPrestarted()
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
