package agent

import (
	"os"
	"os/exec"
	"syscall"
)

// A pre-started program (Config.Prestart) is the next run's process,
// started as soon as the sandbox is idle so that the interpreter's start
// (R: ~0.3 s, more with ggplot2 loaded) is over when the run comes. It is
// Launch with the program's path /dev/fd/3: the interpreter starts, opens
// that pipe and blocks reading it; the run writes its source there and
// closes it. It has its own stdin, stdout and stderr pipes, which become
// the run's. It serves one run and is gone with it: it is no long-lived
// process (unlike a zygote it never outlives its program), it is started
// only after the last run's sweep (or a reset), so nothing of a program
// runs while it starts, and it is what `LAUNCH main.R` would be: the same
// command and environment. It starts in /, not in the programs' folder:
// during a reset the folder still holds the last conversation's files
// (the executor empties it afterwards), and an interpreter that read
// anything from its working directory at its start would read them. The
// image's boot script, or Prelude, moves it to the programs' folder once
// its program has come.
//
// A run that brings environment variables of its own, or keeps state,
// does not use it: it is killed and the run starts the ordinary way.
//
// Once a program matched PreloadWhen, the pre-started programs of the
// sandbox are given Preload first (R: loadNamespace of ggplot2, dplyr and
// readr, which attaches nothing), so that a conversation that drew a chart
// finds the packages loaded for the next one. A reset forgets that.

// prestartSource is the path a pre-started program reads its source from.
const prestartSource = "/dev/fd/3"

type prestarted struct {
	pid    int
	ended  <-chan syscall.WaitStatus
	source *os.File // our end of its fd 3
	stdinW *os.File
	outR   *os.File
	errR   *os.File
}

// prestart starts the next run's process, if the agent pre-starts and has
// none. It is called when no program runs: at the start, after each run's
// sweep and after a reset.
func (st *starter) prestart() {
	if !st.cfg.Prestart || st.next != nil {
		return
	}
	var files []*os.File // every end, closed on failure
	pipe := func() (r, w *os.File) {
		r, w, err := os.Pipe()
		if err != nil {
			return nil, nil
		}
		files = append(files, r, w)
		return r, w
	}
	stdinR, stdinW := pipe()
	outR, outW := pipe()
	errR, errW := pipe()
	srcR, srcW := pipe()
	if len(files) != 8 {
		closeAll(files...)
		return
	}
	argv := expand(st.cfg.Launch, prestartSource, "")
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Dir = "/"
	cmd.Env = st.cfg.Env
	cmd.Stdin, cmd.Stdout, cmd.Stderr = stdinR, outW, errW
	cmd.ExtraFiles = []*os.File{srcR}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Credential: st.cfg.User}
	ended, err := st.waiter.start(cmd)
	closeAll(stdinR, outW, errW, srcR)
	if err != nil {
		closeAll(stdinW, outR, errR, srcW)
		return
	}
	// Smaller than a pipe's buffer: this does not wait for it.
	if st.cfg.Prelude != "" {
		_, _ = srcW.WriteString(st.cfg.Prelude + "\n")
	}
	if st.preloaded && st.cfg.Preload != "" {
		_, _ = srcW.WriteString(st.cfg.Preload + "\n")
	}
	st.next = &prestarted{pid: cmd.Process.Pid, ended: ended, source: srcW, stdinW: stdinW, outR: outR, errR: errR}
}

// takePrestarted returns the pre-started process for run, or nil: there
// is none, it died, or the run cannot use it (then it is killed).
func (st *starter) takePrestarted(run Run) *prestarted {
	n := st.next
	st.next = nil
	if n == nil {
		return nil
	}
	select {
	case <-n.ended:
		closeAll(n.source, n.stdinW, n.outR, n.errR)
		return nil
	default:
	}
	if len(run.Env) == 0 && !run.KeepState && run.Filesystem == nil {
		return n
	}
	n.discard()
	return nil
}

// dropPrestarted kills the pre-started process, if any.
func (st *starter) dropPrestarted() {
	if n := st.next; n != nil {
		st.next = nil
		n.discard()
	}
}

// discard kills a pre-started process that was not used.
func (n *prestarted) discard() {
	_ = syscall.Kill(-n.pid, syscall.SIGKILL)
	<-n.ended
	closeAll(n.source, n.stdinW, n.outR, n.errR)
}

// feed writes a program's source to its pre-started process and closes
// the pipe: the process reads it as it goes, and may stop reading (exit)
// before the end.
func (n *prestarted) feed(code string) {
	_, _ = n.source.WriteString(code)
	if code != "" && code[len(code)-1] != '\n' {
		_, _ = n.source.WriteString("\n")
	}
	n.source.Close()
}
