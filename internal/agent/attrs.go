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
//
// gVisor's release of 2022-12 refuses ioprio_get and ioprio_set to every
// process (EPERM: the sentry has no I/O scheduler): the I/O priority can
// then be neither read nor changed, and the check instead proves, each
// time, that it still cannot be changed — a kernel that let ioprio_set
// through while refusing ioprio_get fails it (see ioprioFixed). Later
// releases keep a priority per process, readable by another only with its
// user's uid or CAP_SYS_NICE (the agent apart from programs has it).
type procAttrs struct {
	limits   [nLimits]unix.Rlimit
	nice     int
	affinity unix.CPUSet
	policy   uintptr
	ioprio   uintptr
	// ioprioFixed is set when the kernel refuses ioprio_get and
	// ioprio_set alike; ioprio is then 0.
	ioprioFixed bool
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
	a.ioprio, _, errno = unix.Syscall(unix.SYS_IOPRIO_GET, ioprioWhoProcess, uintptr(pid), 0)
	switch {
	case errno == 0:
	case refused(errno):
		if err := ioprioSetRefused(); err != nil {
			return a, err
		}
		a.ioprio, a.ioprioFixed = 0, true
	default:
		return a, fmt.Errorf("ioprio_get: %w", errno)
	}
	return a, nil
}

// refused reports an errno with which a kernel declines a system call it
// does not offer.
func refused(errno unix.Errno) bool {
	return errno == unix.EPERM || errno == unix.ENOSYS
}

// ioprioSetRefused proves that no process here can change an I/O
// priority: ioprio_set is refused to the agent itself (the kernel is the
// same for every process of the sandbox, and a program has no privilege
// the agent lacks). The priority it asks for is the lowest, so that a
// kernel that accepted it would have lowered nothing but the agent's own,
// which the caller then reports.
func ioprioSetRefused() error {
	const classIdle = 3 // IOPRIO_CLASS_IDLE << IOPRIO_CLASS_SHIFT (13)
	_, _, errno := unix.Syscall(unix.SYS_IOPRIO_SET, ioprioWhoProcess, 0, classIdle<<13)
	if errno == 0 {
		return fmt.Errorf("ioprio_get is refused but ioprio_set is not: an I/O priority could be changed unseen")
	}
	if !refused(errno) {
		return fmt.Errorf("ioprio_set: %w", errno)
	}
	return nil
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
	case now.ioprio != a.ioprio || now.ioprioFixed != a.ioprioFixed:
		return fmt.Errorf("I/O priority changed")
	}
	return nil
}
