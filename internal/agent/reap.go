package agent

import (
	"errors"
	"os"
	"os/exec"
	"os/signal"
	"sync"
	"syscall"
)

// A waiter starts the agent's children and reports how each ended.
//
// As the container's PID 1 the agent inherits every orphan a program
// leaves (a double fork, a daemon), and must reap them, or their zombies
// fill the sandbox's pids limit. A reaper that waits for any child would
// take the exit status of the agent's own children from exec.Cmd.Wait, so
// as PID 1 one reaper does all the waiting and hands the agent's children
// their status; elsewhere (tests, a process of a larger tree) each child
// is waited for on its own.
type waiter interface {
	// start starts cmd; the channel receives its wait status once.
	start(cmd *exec.Cmd) (<-chan syscall.WaitStatus, error)
}

// newWaiter returns the reaper for PID 1, else plain waits.
func newWaiter() waiter {
	if os.Getpid() == 1 {
		r := &reaper{waiting: map[int]waiting{}}
		go r.run()
		return r
	}
	return plainWaiter{}
}

type plainWaiter struct{}

func (plainWaiter) start(cmd *exec.Cmd) (<-chan syscall.WaitStatus, error) {
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	ch := make(chan syscall.WaitStatus, 1)
	go func() {
		_ = cmd.Wait()
		ws, _ := cmd.ProcessState.Sys().(syscall.WaitStatus)
		ch <- ws
	}()
	return ch, nil
}

// reaper waits for every child of PID 1: the agent's own get their
// status, orphans are just reaped.
type reaper struct {
	mu      sync.Mutex
	waiting map[int]waiting
}

type waiting struct {
	ch   chan syscall.WaitStatus
	proc *os.Process
}

// start starts cmd under the lock the reaper takes before it hands out a
// status, so a child that ends at once is registered before its status
// is looked up.
func (r *reaper) start(cmd *exec.Cmd) (<-chan syscall.WaitStatus, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	ch := make(chan syscall.WaitStatus, 1)
	r.waiting[cmd.Process.Pid] = waiting{ch: ch, proc: cmd.Process}
	return ch, nil
}

func (r *reaper) run() {
	sigs := make(chan os.Signal, 1)
	signal.Notify(sigs, syscall.SIGCHLD)
	for range sigs {
		r.reapAll()
	}
}

// reapAll reaps every child that has ended.
func (r *reaper) reapAll() {
	for {
		var ws syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
		if errors.Is(err, syscall.EINTR) {
			continue
		}
		if err != nil || pid <= 0 {
			return
		}
		r.mu.Lock()
		if w, ok := r.waiting[pid]; ok {
			w.ch <- ws
			_ = w.proc.Release()
			delete(r.waiting, pid)
		}
		r.mu.Unlock()
	}
}
