package agent

import (
	"fmt"

	"golang.org/x/sys/unix"
)

// procAttrs are the attributes of a process that any process of the same
// user may change, not being dumpable notwithstanding (prlimit,
// setpriority, sched_setaffinity, sched_setscheduler, ioprio_set), and
// that the process's children inherit. A program runs as the agent's user,
// so it can change them in the agent and the template, the two processes
// that outlive its conversation: a reset checks them (fail closed: it
// cannot raise a limit a program lowered, nor undo a lower priority).
type procAttrs struct {
	limits   [nLimits]unix.Rlimit
	nice     int
	affinity unix.CPUSet
	policy   uintptr
	ioprio   uintptr
}

// nLimits is the number of resource limits Linux has (RLIM_NLIMITS).
const nLimits = unix.RLIMIT_RTTIME + 1

// ioprioWhoProcess is IOPRIO_WHO_PROCESS of ioprio_get(2).
const ioprioWhoProcess = 1

// readAttrs reads the attributes of process pid (0: this one).
func readAttrs(pid int) (procAttrs, error) {
	var a procAttrs
	for r := range a.limits {
		if err := unix.Prlimit(pid, r, nil, &a.limits[r]); err != nil {
			return a, fmt.Errorf("prlimit %d: %w", r, err)
		}
	}
	var err error
	if a.nice, err = unix.Getpriority(unix.PRIO_PROCESS, pid); err != nil {
		return a, fmt.Errorf("getpriority: %w", err)
	}
	if err := unix.SchedGetaffinity(pid, &a.affinity); err != nil {
		return a, fmt.Errorf("sched_getaffinity: %w", err)
	}
	var errno unix.Errno
	if a.policy, _, errno = unix.Syscall(unix.SYS_SCHED_GETSCHEDULER, uintptr(pid), 0, 0); errno != 0 {
		return a, fmt.Errorf("sched_getscheduler: %w", errno)
	}
	if a.ioprio, _, errno = unix.Syscall(unix.SYS_IOPRIO_GET, ioprioWhoProcess, uintptr(pid), 0); errno != 0 {
		return a, fmt.Errorf("ioprio_get: %w", errno)
	}
	return a, nil
}

// check reports whether process pid (0: this one) still has the
// attributes a.
func (a procAttrs) check(pid int) error {
	now, err := readAttrs(pid)
	if err != nil {
		return err
	}
	for r := range a.limits {
		if now.limits[r] != a.limits[r] {
			return fmt.Errorf("resource limit %d changed", r)
		}
	}
	switch {
	case now.nice != a.nice:
		return fmt.Errorf("priority changed")
	case now.affinity != a.affinity:
		return fmt.Errorf("CPU affinity changed")
	case now.policy != a.policy:
		return fmt.Errorf("scheduling policy changed")
	case now.ioprio != a.ioprio:
		return fmt.Errorf("I/O priority changed")
	}
	return nil
}
