package agent

import (
	"errors"
	"fmt"
	"os"
	"runtime"
	"strconv"
	"unsafe"

	"golang.org/x/net/bpf"
	"golang.org/x/sys/unix"
)

// POSIX message queues outlive the programs that make them, in the
// sandbox's IPC namespace. Docker mounts an mqueue file system at
// /dev/mqueue under runc, where a reset empties and checks it (Config.Wipe).
// gVisor has none, yet lets programs make queues, which would then pass
// unseen to the sandbox's next conversation. There the agent forbids
// mq_open to itself and to every process of the sandbox (all descend from
// it) with a seccomp filter before it starts any, and a reset proves the
// refusal by asking for a queue itself (mqueueListable).

// mqueueDir is where Docker mounts the sandbox's mqueue file system.
const mqueueDir = "/dev/mqueue"

// mqueueListable checks that the POSIX message queues of the sandbox can
// be seen (and so wiped), an mqueue file system at dir, or else that none
// can be made: the agent's own mq_open is refused.
func mqueueListable(dir string) error {
	const mqueueMagic = 0x19800202
	var fs unix.Statfs_t
	if err := unix.Statfs(dir, &fs); err == nil && fs.Type == mqueueMagic {
		return nil
	}
	// The system call takes the name without mq_open(3)'s leading '/'.
	name := []byte("runbox-probe-" + strconv.Itoa(os.Getpid()) + "\x00")
	fd, _, errno := unix.Syscall6(unix.SYS_MQ_OPEN, uintptr(unsafe.Pointer(&name[0])),
		unix.O_CREAT|unix.O_EXCL|unix.O_RDONLY|unix.O_CLOEXEC, 0o600, 0, 0, 0)
	if refused(errno) {
		return nil // none can be made here
	}
	if errno != 0 {
		return fmt.Errorf("mq_open: %w", errno)
	}
	unix.Close(int(fd))
	_, _, _ = unix.Syscall(unix.SYS_MQ_UNLINK, uintptr(unsafe.Pointer(&name[0])), 0, 0)
	return errors.New("POSIX message queues can be made here but not listed")
}

// DenyMqueuesUnlisted forbids mq_open to this process and all it starts
// from now on, if the sandbox has no mqueue file system to list queues by.
// The real agent calls it at start, before its first child.
func DenyMqueuesUnlisted() error {
	if mqueueListable(mqueueDir) == nil {
		return nil
	}
	return denyMqOpen()
}

// denyMqOpen installs, on every thread, a seccomp filter under which
// mq_open fails with EPERM (and which refuses system calls of a foreign
// architecture or the x32 ABI, so that none bypasses it).
func denyMqOpen() error {
	var arch uint32
	switch runtime.GOARCH {
	case "amd64":
		arch = unix.AUDIT_ARCH_X86_64
	case "arm64":
		arch = unix.AUDIT_ARCH_AARCH64
	default:
		return fmt.Errorf("no seccomp filter for %s", runtime.GOARCH)
	}
	const (
		offNr, offArch = 0, 4 // struct seccomp_data
		x32            = 0x40000000
		deny           = unix.SECCOMP_RET_ERRNO | uint32(unix.EPERM)
		allow          = 0x7fff0000 // SECCOMP_RET_ALLOW
	)
	prog, err := bpf.Assemble([]bpf.Instruction{
		bpf.LoadAbsolute{Off: offArch, Size: 4},
		bpf.JumpIf{Cond: bpf.JumpNotEqual, Val: arch, SkipTrue: 3},
		bpf.LoadAbsolute{Off: offNr, Size: 4},
		bpf.JumpIf{Cond: bpf.JumpGreaterOrEqual, Val: x32, SkipTrue: 1},
		bpf.JumpIf{Cond: bpf.JumpNotEqual, Val: unix.SYS_MQ_OPEN, SkipTrue: 1},
		bpf.RetConstant{Val: deny},
		bpf.RetConstant{Val: allow},
	})
	if err != nil {
		return err
	}
	filter := make([]unix.SockFilter, len(prog))
	for i, in := range prog {
		filter[i] = unix.SockFilter{Code: in.Op, Jt: in.Jt, Jf: in.Jf, K: in.K}
	}
	fprog := unix.SockFprog{Len: uint16(len(filter)), Filter: &filter[0]}
	// no_new_privs lets an unprivileged process install a filter; the
	// container has it set already.
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		return fmt.Errorf("no_new_privs: %w", err)
	}
	if _, _, errno := unix.Syscall(unix.SYS_SECCOMP, unix.SECCOMP_SET_MODE_FILTER, unix.SECCOMP_FILTER_FLAG_TSYNC,
		uintptr(unsafe.Pointer(&fprog))); errno != 0 {
		return fmt.Errorf("seccomp: %w", errno)
	}
	return nil
}
