package agent

import (
	"os/exec"
	"runtime"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// TestAttrsCheck: each change a process of the same user can make to
// another's inherited attributes is seen.
func TestAttrsCheck(t *testing.T) {
	tests := []struct {
		name   string
		change func(pid int) error
		want   string
	}{
		{"unchanged", func(int) error { return nil }, ""},
		{"resource limit", func(pid int) error {
			var l unix.Rlimit
			if err := unix.Prlimit(pid, unix.RLIMIT_NOFILE, nil, &l); err != nil {
				return err
			}
			l.Cur = min(l.Cur, 64) - 1
			return unix.Prlimit(pid, unix.RLIMIT_NOFILE, &l, nil)
		}, "resource limit 7 changed"},
		{"priority", func(pid int) error {
			return unix.Setpriority(unix.PRIO_PROCESS, pid, 19)
		}, "priority changed"},
		{"scheduling policy", func(pid int) error {
			return unix.SchedSetAttr(pid, &unix.SchedAttr{Size: unix.SizeofSchedAttr, Policy: 5 /* SCHED_IDLE */}, 0)
		}, "scheduling policy changed"},
		{"I/O priority", func(pid int) error {
			const ioprioSet, classIdle = unix.SYS_IOPRIO_SET, 3
			if _, _, errno := unix.Syscall(ioprioSet, ioprioWhoProcess, uintptr(pid), classIdle<<13); errno != 0 {
				return errno
			}
			return nil
		}, "I/O priority changed"},
	}
	if runtime.NumCPU() > 1 {
		tests = append(tests, struct {
			name   string
			change func(pid int) error
			want   string
		}{"CPU affinity", func(pid int) error {
			var one unix.CPUSet
			one.Set(0)
			return unix.SchedSetaffinity(pid, &one)
		}, "CPU affinity changed"})
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cmd := exec.Command("sleep", "30")
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
			pid := cmd.Process.Pid
			before, err := readAttrs(pid)
			if err != nil {
				t.Fatal(err)
			}
			if err := tt.change(pid); err != nil {
				t.Fatal(err)
			}
			err = before.check(pid)
			switch {
			case tt.want == "" && err != nil:
				t.Fatalf("check: %v, want nil", err)
			case tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)):
				t.Fatalf("check: %v, want %q", err, tt.want)
			}
		})
	}
}
