package agent

import (
	"encoding/json"
	"errors"
	"fmt"
	"log"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"time"
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
	served    int      // runs forked from it whose sweep is over (forkAhead)
	stopped   bool

	quit     chan struct{} // closed by stop
	stopOnce sync.Once
	done     chan struct{} // closed when run returns
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

// processID returns the zygote's pid, which a sweep must spare (0 if none).
func (z *zygote) processID() int {
	z.mu.Lock()
	defer z.mu.Unlock()
	return z.pid
}

var errZygoteGone = errors.New("zygote is not running")

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
