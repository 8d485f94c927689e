package agent

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// A zygote is a long-lived process that has done a language's slow start
// (for Python: importing pandas, numpy and matplotlib) and forks a child per
// program. It speaks JSON messages over a SOCK_SEQPACKET socket, passing the
// program's stdin, stdout and stderr as file descriptors (see
// runners/python/zygote.py). Until it is ready, and whenever it is gone,
// programs start the ordinary way.
//
// The zygote programs fork from is itself forked ("spawned") from a
// template: a zygote that the agent only ever asks to spawn, and that no
// program reaches (it is not dumpable, reads only the read-only image, and
// ignores the signals a program could end it with). A reset kills the
// conversation's zygote and spawns another from the template: as fresh as
// one started anew, for a fork's cost (~6 ms of CPU here) instead of
// Python's start (~70 ms), paid at every hand-over to another
// conversation before.

// zygoteStartTimeout bounds the wait for a fork's pid.
const zygoteStartTimeout = 5 * time.Second

type zygote struct {
	command []string
	env     []string
	user    *syscall.Credential // Config.User
	waiter  waiter
	// template, when set and ready, spawns this zygote instead of a start
	// of command.
	template *zygote
	// busy is held while a program runs; the zygote starts only when it
	// can take it, and keeps it until the zygote has made itself not
	// dumpable (its first message).
	busy *sync.Mutex

	mu        sync.Mutex
	sock      *os.File // our end
	pid       int
	ready     bool
	readyCh   chan struct{}   // closed when ready turns true
	preloaded bool            // a preload was asked of this zygote
	forks     chan zygoteFork // answers to the one pending start
	exits     map[int]chan syscall.WaitStatus
	aheads    []*ahead // the next programs' processes, forked ahead, oldest first
	preforks  int      // preforks asked for, numbering them
	stopped   bool

	quit     chan struct{} // closed by stop
	stopOnce sync.Once
	done     chan struct{} // closed when run returns
}

type zygoteFork struct {
	pid  int
	exit chan syscall.WaitStatus
}

type zygoteMessage struct {
	Ready  bool `json:"ready"`
	PID    int  `json:"pid"`
	Ahead  int  `json:"ahead"`
	Seq    int  `json:"seq"` // of the prefork an ahead answers
	Exit   int  `json:"exit"`
	Status int  `json:"status"`
}

func newZygote(command, env []string, user *syscall.Credential, w waiter, busy *sync.Mutex, template *zygote) *zygote {
	return &zygote{command: command, env: env, user: user, waiter: w, busy: busy, template: template, forks: make(chan zygoteFork, 1), exits: map[int]chan syscall.WaitStatus{},
		readyCh: make(chan struct{}), quit: make(chan struct{}), done: make(chan struct{})}
}

// setReady records readiness; the caller holds z.mu.
func (z *zygote) setReady(ready bool) {
	if ready == z.ready {
		return
	}
	z.ready = ready
	if ready {
		close(z.readyCh)
	} else {
		z.readyCh = make(chan struct{})
	}
}

// waitReady waits up to d for a running zygote to be ready (it is
// starting, or importing); one that is not running is not waited for.
func (z *zygote) waitReady(d time.Duration) bool {
	z.mu.Lock()
	ready, ch, running := z.ready, z.readyCh, z.sock != nil
	z.mu.Unlock()
	if ready || !running {
		return ready
	}
	select {
	case <-ch:
		return true
	case <-time.After(d):
		return false
	}
}

// awaitReady waits up to d for the zygote to be ready, whether it is
// running or yet to start (it starts only while no program runs).
func (z *zygote) awaitReady(d time.Duration) bool {
	z.mu.Lock()
	ready, ch := z.ready, z.readyCh
	z.mu.Unlock()
	if ready {
		return true
	}
	select {
	case <-ch:
		return true
	case <-time.After(d):
		return false
	}
}

// preload asks the zygote, once, to import modules for the programs to
// come. It is not ready again until it has.
func (z *zygote) preload(modules string) error {
	z.mu.Lock()
	asked := z.preloaded
	z.mu.Unlock()
	if !asked {
		z.endAhead() // it lacks what is imported now
	}
	z.mu.Lock()
	defer z.mu.Unlock()
	if z.preloaded || z.sock == nil || !z.ready {
		return nil
	}
	req, err := json.Marshal(map[string]string{"preload": modules})
	if err != nil {
		return err
	}
	if _, err := z.sock.Write(req); err != nil {
		return fmt.Errorf("send to zygote: %w", err)
	}
	z.preloaded = true
	z.setReady(false)
	return nil
}

// run keeps the zygote alive until stop, restarting it with a backoff when
// it dies.
func (z *zygote) run() {
	defer close(z.done)
	backoff := time.Second
	for {
		start := time.Now()
		err := z.runOnce()
		select {
		case <-z.quit:
			return
		default:
		}
		log.Printf("zygote ended: %v", err)
		if time.Since(start) > time.Minute {
			backoff = time.Second
		}
		select {
		case <-z.quit:
			return
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 30*time.Second)
	}
}

func (z *zygote) runOnce() error {
	if t := z.template; t != nil {
		// Before busy: the template takes it to start. A stop, or the
		// template's end, ends the wait: a reset waits for this zygote.
		t.mu.Lock()
		ready := t.readyCh
		t.mu.Unlock()
		select {
		case <-ready:
		case <-t.done:
		case <-z.quit:
			return errZygoteGone
		case <-time.After(zygoteWait):
		}
	}
	z.busy.Lock()
	var unlock sync.Once
	release := func() { unlock.Do(z.busy.Unlock) }
	defer release()
	select {
	case <-z.quit: // stopped while it waited
		return errZygoteGone
	default:
	}
	pid, ours, ended, err := z.launch()
	if err != nil {
		return fmt.Errorf("start: %w", err)
	}
	defer ours.Close()
	reaped := false
	kill := func() {
		if reaped {
			return
		}
		select {
		case <-ended:
			reaped = true // the pid may be another's now
		default:
			_ = syscall.Kill(pid, syscall.SIGKILL)
		}
	}
	z.mu.Lock()
	z.sock, z.pid = ours, pid
	stopped := z.stopped
	z.mu.Unlock()
	if stopped { // stop came before it had a pid to kill
		kill()
	}
	readErr := z.read(ours, release)
	z.mu.Lock()
	z.setReady(false)
	z.dropAheadLocked()
	z.sock, z.pid, z.preloaded = nil, 0, false
	// Programs it forked are orphans now; their runs end when the agent
	// sees their pipes close and their group killed.
	for pid, ch := range z.exits {
		ch <- syscall.WaitStatus(syscall.SIGKILL)
		delete(z.exits, pid)
	}
	z.mu.Unlock()
	kill()
	if !reaped {
		z.awaitEnd(ended)
	}
	return readErr
}

// continueEvery is how often a zygote's end, awaited, continues its
// template.
const continueEvery = 50 * time.Millisecond

// awaitEnd waits for the zygote's end. A zygote spawned from the template
// is the template's child: its end comes from the template, which reaps
// it — unless a program stopped the template (it runs as the programs'
// user), which is therefore continued while the end is awaited. A reset
// waits for this, and would otherwise wait for good.
func (z *zygote) awaitEnd(ended <-chan syscall.WaitStatus) {
	if z.template == nil {
		<-ended
		return
	}
	t := time.NewTicker(continueEvery)
	defer t.Stop()
	for {
		if pid := z.template.processID(); pid > 0 {
			_ = syscall.Kill(pid, syscall.SIGCONT)
		}
		select {
		case <-ended:
			return
		case <-z.template.done:
			<-ended // its end is told by the template's, which has come
			return
		case <-t.C:
		}
	}
}

// launch spawns the zygote from the template, if it is ready, or starts
// command. It returns the zygote's pid, our end of the socket that is its
// fd 3, and a channel that receives its end.
func (z *zygote) launch() (int, *os.File, <-chan syscall.WaitStatus, error) {
	if t := z.template; t != nil && t.waitReady(0) {
		// A program may have stopped it; no program runs now (busy is
		// held), and a stop leaves nothing behind.
		if pid := t.processID(); pid > 0 {
			_ = syscall.Kill(pid, syscall.SIGCONT)
		}
		ours, theirs, err := socketPair()
		if err != nil {
			return 0, nil, nil, err
		}
		f, err := t.fork(forkRequest{Spawn: true}, []*os.File{theirs})
		theirs.Close()
		if err == nil {
			return f.pid, ours, f.exit, nil
		}
		ours.Close()
		// A template that does not answer (a program may have stopped it)
		// spawns no more: it is ended, and replaced at the next reset.
		log.Printf("zygote: spawn from the template: %v; starting one", err)
		t.stop()
	}
	ours, theirs, err := socketPair()
	if err != nil {
		return 0, nil, nil, err
	}
	defer theirs.Close()
	cmd := exec.Command(z.command[0], z.command[1:]...)
	cmd.Env = z.env
	cmd.Dir = "/tmp"
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	cmd.ExtraFiles = []*os.File{theirs} // fd 3
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: z.user}
	ended, err := z.waiter.start(cmd)
	if err != nil {
		ours.Close()
		return 0, nil, nil, err
	}
	return cmd.Process.Pid, ours, ended, nil
}

// socketPair returns the two ends of a new SOCK_SEQPACKET socket. Ours is
// non-blocking, so that the runtime's poller serves it: a goroutine that
// reads it parks, and the one a message wakes runs on the same thread,
// where a read blocked in the kernel held its thread (and the goroutine it
// woke waited for another: 1 to 2 ms each time under gVisor); and closing
// it ends a read under way. Theirs is blocking, as a child expects.
func socketPair() (ours, theirs *os.File, err error) {
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_SEQPACKET|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("socketpair: %w", err)
	}
	if err := syscall.SetNonblock(fds[0], true); err != nil {
		syscall.Close(fds[0])
		syscall.Close(fds[1])
		return nil, nil, fmt.Errorf("socketpair: %w", err)
	}
	return os.NewFile(uintptr(fds[0]), "ours"), os.NewFile(uintptr(fds[1]), "theirs"), nil
}

// sendFiles sends msg on sock, ours of a socketPair, with the descriptors
// of files (blocking ones: a child gets them). sock's own descriptor is
// used through SyscallConn, since File.Fd would make it blocking.
func sendFiles(sock *os.File, msg []byte, files []*os.File) error {
	fds := make([]int, len(files))
	for i, f := range files {
		fds[i] = int(f.Fd())
	}
	rc, err := sock.SyscallConn()
	if err != nil {
		return err
	}
	var sendErr error
	if err := rc.Write(func(fd uintptr) bool {
		sendErr = syscall.Sendmsg(int(fd), msg, syscall.UnixRights(fds...), nil, 0)
		return sendErr != syscall.EAGAIN
	}); err != nil {
		return err
	}
	return sendErr
}

// read handles the zygote's messages until its socket closes. The first
// one means the zygote is no longer dumpable: first is called then.
func (z *zygote) read(sock *os.File, first func()) error {
	buf := make([]byte, 4096)
	for {
		n, err := sock.Read(buf)
		if err != nil {
			return err
		}
		if n == 0 {
			return io.EOF
		}
		first()
		var m zygoteMessage
		if err := json.Unmarshal(buf[:n], &m); err != nil {
			return fmt.Errorf("malformed message: %w", err)
		}
		z.mu.Lock()
		switch {
		case m.Ready:
			if z.template != nil && !z.preloaded {
				// Started or spawned (not done importing: the run that
				// asked for that forks its process anyway). Before it is
				// ready: a run waiting for that finds its process forked.
				z.forkAheadLocked()
			}
			z.setReady(true)
		case m.Ahead > 0:
			for _, a := range z.aheads {
				if a.pid == 0 && a.seq == m.Seq {
					a.pid = m.Ahead
					z.exits[m.Ahead] = a.exit
					close(a.known)
				}
			}
		case m.PID > 0:
			ch := make(chan syscall.WaitStatus, 1)
			z.exits[m.PID] = ch
			select {
			case z.forks <- zygoteFork{pid: m.PID, exit: ch}:
			default:
			}
		case m.Exit > 0:
			if ch, ok := z.exits[m.Exit]; ok {
				ch <- syscall.WaitStatus(m.Status)
				delete(z.exits, m.Exit)
			}
		}
		z.mu.Unlock()
	}
}

// aheadDepth is how many programs' processes a zygote keeps forked ahead.
// Two: under gVisor a fork and its first steps take 10 to 20 ms here,
// longer than a client takes to send its next run after an exit, so the
// process forked after one run's sweep is not ready for the next run; the
// one forked a run earlier is.
const aheadDepth = 2

// forkAhead asks a zygote that programs fork from to fork the next ones'
// processes now, ahead of their runs (see "prefork" in zygote.py), each
// with its run's stdio pipes, to which the agent then hands the run's
// request itself: under gVisor a fork, and each hand-over between
// processes, cost more than the rest of a short run. It is asked when the
// zygote has started (or been spawned) and after the sweep of each run
// forked from it, and keeps aheadDepth of them.
func (z *zygote) forkAhead() {
	z.mu.Lock()
	defer z.mu.Unlock()
	if z.ready {
		z.forkAheadLocked()
	}
}

// forkAheadLocked is forkAhead for a caller that holds z.mu.
func (z *zygote) forkAheadLocked() {
	for z.sock != nil && len(z.aheads) < aheadDepth {
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

// processID returns the zygote's pid, which a sweep must spare (0 if none).
func (z *zygote) processID() int {
	z.mu.Lock()
	defer z.mu.Unlock()
	return z.pid
}

var errZygoteGone = errors.New("zygote is not running")

// forkRequest is what the zygote forks: a program at Path, a kernel, or
// (from the template) a zygote.
type forkRequest struct {
	Path   string            `json:"path,omitempty"`
	Dir    string            `json:"cwd"`
	Env    []string          `json:"-"`
	EnvMap map[string]string `json:"env"`
	Kernel bool              `json:"kernel,omitempty"`
	Spawn  bool              `json:"spawn,omitempty"`
}

// encode returns the request as the zygote (or a process forked ahead)
// reads it.
func (fr forkRequest) encode() ([]byte, error) {
	fr.EnvMap = make(map[string]string, len(fr.Env))
	for _, kv := range fr.Env {
		if k, v, ok := strings.Cut(kv, "="); ok {
			fr.EnvMap[k] = v
		}
	}
	return json.Marshal(fr)
}

// fork starts a program (or a kernel, or a zygote) from the zygote with
// the given descriptors: stdin, stdout, stderr and, for a kernel, its
// socket; for a zygote, its socket alone.
func (z *zygote) fork(fr forkRequest, files []*os.File) (zygoteFork, error) {
	z.mu.Lock()
	sock, ready := z.sock, z.ready
	z.mu.Unlock()
	if sock == nil || !ready {
		return zygoteFork{}, errZygoteGone
	}
	req, err := fr.encode()
	if err != nil {
		return zygoteFork{}, err
	}
	select {
	case <-z.forks: // a stale answer to a start that timed out
	default:
	}
	if err := sendFiles(sock, req, files); err != nil {
		return zygoteFork{}, fmt.Errorf("send to zygote: %w", err)
	}
	select {
	case f := <-z.forks:
		return f, nil
	case <-time.After(zygoteStartTimeout):
		return zygoteFork{}, errors.New("zygote did not fork")
	}
}

// stop ends the zygote for good; done is closed once it has.
func (z *zygote) stop() {
	z.stopOnce.Do(func() { close(z.quit) })
	z.mu.Lock()
	defer z.mu.Unlock()
	z.stopped = true
	if z.pid > 0 {
		_ = syscall.Kill(z.pid, syscall.SIGKILL)
	}
}
