package agent

import (
	"bytes"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

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
