package agent

import (
	"encoding/json"
	"fmt"
	"log"
	"os"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// aheadDepth is how many programs' processes a zygote keeps forked ahead
// once it has served two runs. Two: under gVisor a fork and its first
// steps take 10 to 20 ms here, longer than a client takes to send its
// next run after an exit, so the process forked after one run's sweep is
// not ready for the next run; the one forked a run earlier is.
//
// Until then it keeps aheadFirst. A zygote is spawned for every
// conversation a sandbox serves (a reset), and the next reset ends it with
// what it forked ahead unused: under a burst of new conversations a
// sandbox serves one run between two resets, and with two forked from the
// start three processes were forked, and two ended unused, for the one
// run — each a fork, its first steps and an exit, the dearest work of a
// sandbox where page faults are dear (gVisor; a host without nested
// paging, docs/performance.md). A conversation's second run then finds
// the one forked after its first, waiting for the end of its fork if it
// comes sooner.
const (
	aheadDepth = 2
	aheadFirst = 1
)

// depthLocked is how many processes z keeps forked ahead now. The caller
// holds z.mu.
func (z *zygote) depthLocked() int {
	if z.served < 2 {
		return aheadFirst
	}
	return aheadDepth
}

// forkAhead asks a zygote that programs fork from to fork the next ones'
// processes now, ahead of their runs (see "prefork" in zygote.py), each
// with its run's stdio pipes, to which the agent then hands the run's
// request itself: under gVisor a fork, and each hand-over between
// processes, cost more than the rest of a short run. It is asked when the
// zygote has started (or been spawned) and after the sweep of each run
// forked from it, and keeps depthLocked of them.
func (z *zygote) forkAhead() {
	z.mu.Lock()
	defer z.mu.Unlock()
	z.served++
	if z.ready {
		z.forkAheadLocked()
	}
}

// forkAheadLocked is forkAhead for a caller that holds z.mu.
func (z *zygote) forkAheadLocked() {
	for z.sock != nil && len(z.aheads) < z.depthLocked() {
		if !z.forkOneAheadLocked() {
			return
		}
	}
}

// forkOneAheadLocked asks for one process forked ahead and reports
// whether the zygote was asked. The caller holds z.mu.
func (z *zygote) forkOneAheadLocked() bool {
	a, theirs, err := newAhead()
	if err != nil {
		log.Printf("zygote: fork ahead: %v", err)
		return false
	}
	defer closeAll(theirs...)
	z.preforks++
	a.seq = z.preforks
	req := fmt.Appendf(nil, `{"prefork": true, "seq": %d}`, a.seq)
	if err := sendFiles(z.sock, req, theirs); err != nil {
		a.close()
		log.Printf("zygote: fork ahead: %v", err)
		return false
	}
	z.aheads = append(z.aheads, a)
	return true
}

// dropAheadLocked gives up the processes forked ahead: each sees its
// socket close and exits. The caller holds z.mu.
func (z *zygote) dropAheadLocked() {
	for _, a := range z.aheads {
		if a.pid > 0 {
			delete(z.exits, a.pid)
		} else {
			close(a.known)
		}
		a.close()
	}
	z.aheads = nil
}

// endAhead ends the processes forked ahead and waits until the zygote has
// reaped them (each wait at most aheadWait): a program that does not take
// one (a kept-state cell, one under filesystem rules, one the zygote
// imports for first) must not find them.
func (z *zygote) endAhead() {
	z.mu.Lock()
	aheads := z.aheads
	z.aheads = nil
	z.mu.Unlock()
	for _, a := range aheads {
		z.endOne(a)
	}
}

// endOne ends a process forked ahead that is no longer in z.aheads.
func (z *zygote) endOne(a *ahead) {
	defer a.close() // a process still being forked sees its socket close, and exits
	select {
	case <-a.known:
	case <-time.After(aheadWait):
	}
	z.mu.Lock()
	pid := a.pid
	z.mu.Unlock()
	if pid == 0 {
		return
	}
	_ = syscall.Kill(pid, syscall.SIGKILL)
	select {
	case <-a.exit:
	case <-time.After(aheadWait):
	}
	z.mu.Lock()
	delete(z.exits, pid)
	z.mu.Unlock()
}

// spares reports whether a sweep must spare pid as a process forked ahead.
// One the zygote is still forking can be found before its pid is known
// here: a child of the zygote found while a fork ahead is pending is
// waited for (each at most aheadWait), then judged. (A program can make a
// child of the zygote, with CLONE_PARENT; it is not one of these.)
func (z *zygote) spares(pid int) bool {
	z.mu.Lock()
	known, pending, zygote := false, []*ahead(nil), z.pid
	for _, a := range z.aheads {
		switch a.pid {
		case pid:
			known = true
		case 0:
			pending = append(pending, a)
		}
	}
	z.mu.Unlock()
	if known || len(pending) == 0 || zygote == 0 {
		return known
	}
	if _, ppid, _ := procStat(pid); ppid != zygote {
		return known
	}
	for _, a := range pending {
		select {
		case <-a.known:
		case <-time.After(aheadWait):
		}
	}
	z.mu.Lock()
	defer z.mu.Unlock()
	for _, a := range z.aheads {
		if a.pid == pid {
			return true
		}
	}
	return false
}

// aheadWait bounds the wait for the pid of a process being forked ahead,
// and for its end.
const aheadWait = time.Second

// handAhead hands fr to the oldest process forked ahead that is alive and
// returns it running the program, or nil when there is none, the oldest
// is not forked yet, or all died (the run then forks the ordinary way).
func (z *zygote) handAhead(fr forkRequest) *ahead {
	z.mu.Lock()
	none := len(z.aheads) == 0
	z.mu.Unlock()
	if none {
		return nil // before encoding fr, which fork would encode again
	}
	req, err := fr.encode()
	if err != nil {
		return nil
	}
	for {
		z.mu.Lock()
		if len(z.aheads) == 0 {
			z.mu.Unlock()
			return nil
		}
		a := z.aheads[0]
		z.mu.Unlock()
		select {
		case <-a.known:
		case <-time.After(aheadWait):
		}
		handed, forking := z.hand(a, req)
		switch {
		case handed:
			return a
		case forking:
			return nil
		}
	}
}

// hand hands req to a, the oldest process forked ahead, and reports
// whether a runs it, or is still being forked (and stays the oldest);
// otherwise a is no longer among z.aheads.
func (z *zygote) hand(a *ahead, req []byte) (handed, forking bool) {
	z.mu.Lock()
	defer z.mu.Unlock()
	if len(z.aheads) == 0 || z.aheads[0] != a {
		return false, false // given up meanwhile
	}
	if a.pid == 0 {
		return false, true
	}
	z.aheads = z.aheads[1:]
	var err error
	select {
	case <-a.exit:
		err = errZygoteGone // killed while it waited (by a program)
	default:
		// A program may have stopped it.
		_ = syscall.Kill(a.pid, syscall.SIGCONT)
		_, err = a.sock.Write(req)
	}
	if err != nil {
		delete(z.exits, a.pid)
		a.close()
		return false, false
	}
	return true, false // its socket stays open for its exit code (wait)
}

// ahead is a program's process forked ahead of its run, with the run's
// stdio.
type ahead struct {
	seq    int           // its prefork's number
	pid    int           // 0 until the zygote tells it; under zygote.mu
	known  chan struct{} // closed when pid is, or when it is given up
	sock   *os.File      // ours: the run's request goes there
	stdinW *os.File
	outR   *os.File
	errR   *os.File
	exit   chan syscall.WaitStatus
}

// newAhead makes the socket and the pipes of a process to fork ahead, and
// returns the ends it is given: its socket, stdin, stdout and stderr.
func newAhead() (*ahead, []*os.File, error) {
	ours, theirs, err := socketPair()
	if err != nil {
		return nil, nil, err
	}
	stdinR, stdinW, outR, outW, errR, errW, err := pipes()
	if err != nil {
		closeAll(ours, theirs)
		return nil, nil, err
	}
	a := &ahead{known: make(chan struct{}), sock: ours, stdinW: stdinW, outR: outR, errR: errR, exit: make(chan syscall.WaitStatus, 1)}
	return a, []*os.File{theirs, stdinR, outW, errW}, nil
}

func (a *ahead) close() { closeAll(a.sock, a.stdinW, a.outR, a.errR) }

// wait returns the wait status of a's process, handed a program: the exit
// code the process sends on its socket as its last step, once it has
// exited, or else the status the zygote reaps (the process was killed, or
// a program ended it otherwise). Its socket is closed then.
//
// The code is the program's own to choose either way; what the agent
// takes from the process alone is only sooner: under gVisor the zygote's
// wake-up, reaping and message, and the agent's wake-up for it, cost 1 ms
// and more (the zygote may be forking the next process ahead then).
func (a *ahead) wait() syscall.WaitStatus {
	defer a.sock.Close()
	reported := make(chan int, 1)
	go func() {
		if code, ok := readExitCode(a.sock); ok {
			reported <- code
		}
	}()
	select {
	case ws := <-a.exit:
		return ws
	case code := <-reported:
		return awaitExit(a.pid, a.exit, syscall.WaitStatus(code<<8))
	}
}

// readExitCode reads {"exit": code} from a process's socket: as untrusted
// as anything a program could write there.
func readExitCode(sock *os.File) (int, bool) {
	buf := make([]byte, 64)
	n, err := sock.Read(buf)
	if err != nil {
		return 0, false
	}
	var m struct {
		Exit *int `json:"exit"`
	}
	if json.Unmarshal(buf[:n], &m) != nil || m.Exit == nil || *m.Exit < 0 || *m.Exit > 255 {
		return 0, false
	}
	return *m.Exit, true
}

// awaitExit waits until process pid has exited and returns ws, or the
// zygote's status for it (reaped) if that comes first.
func awaitExit(pid int, reaped <-chan syscall.WaitStatus, ws syscall.WaitStatus) syscall.WaitStatus {
	exited := make(chan struct{})
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		if waitExited(pid, stop) {
			close(exited)
		}
	}()
	select {
	case zs := <-reaped:
		return zs
	case <-exited:
		return ws
	}
}

// waitExited waits until pid has exited (a zombie, or gone) or stop is
// closed, and reports which. It waits on a pidfd, through the runtime's
// poller, where the kernel has them and can poll them, else scans
// /proc/<pid>/stat, a little later each time.
func waitExited(pid int, stop <-chan struct{}) bool {
	if fd, err := unix.PidfdOpen(pid, unix.PIDFD_NONBLOCK); err == nil {
		f := os.NewFile(uintptr(fd), "pidfd")
		defer f.Close()
		go func() { <-stop; f.Close() }()
		if rc, err := f.SyscallConn(); err == nil {
			err = rc.Read(func(fd uintptr) bool {
				n, _ := unix.Poll([]unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}, 0)
				return n > 0
			})
			if err == nil {
				return true
			}
			select {
			case <-stop:
				return false
			default: // not pollable here
			}
		}
	}
	for pause := 50 * time.Microsecond; alive(pid); pause = min(2*pause, 500*time.Microsecond) {
		select {
		case <-stop:
			return false
		case <-time.After(pause):
		}
	}
	return true
}
