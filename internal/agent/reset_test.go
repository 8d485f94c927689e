package agent

import (
	"os"
	"os/exec"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// TestSysvObjects: the kernel's counters see each kind of System V IPC
// object made, and its removal.
func TestSysvObjects(t *testing.T) {
	base, err := sysvObjects()
	if err != nil {
		t.Fatal(err)
	}
	const private, rmid = 0, 0 // IPC_PRIVATE, IPC_RMID
	make := []struct {
		name   string
		create func() (int, error)
		remove func(id int)
	}{
		{"shm", func() (int, error) { return unix.SysvShmGet(private, 4096, 0o600) },
			func(id int) { _, _ = unix.SysvShmCtl(id, rmid, nil) }},
		{"sem", func() (int, error) {
			id, _, errno := unix.Syscall(unix.SYS_SEMGET, private, 1, 0o600)
			return int(id), errnoErr(errno)
		}, func(id int) { _, _, _ = unix.Syscall6(unix.SYS_SEMCTL, uintptr(id), 0, rmid, 0, 0, 0) }},
		{"msg", func() (int, error) {
			id, _, errno := unix.Syscall(unix.SYS_MSGGET, private, 0o600, 0)
			return int(id), errnoErr(errno)
		}, func(id int) { _, _, _ = unix.Syscall(unix.SYS_MSGCTL, uintptr(id), rmid, 0) }},
	}
	for _, m := range make {
		t.Run(m.name, func(t *testing.T) {
			id, err := m.create()
			if err != nil {
				t.Fatal(err)
			}
			n, err := sysvObjects()
			m.remove(id)
			if err != nil || n != base+1 {
				t.Errorf("with one %s: %d objects (%v), want %d", m.name, n, err, base+1)
			}
			if n, err := sysvObjects(); err != nil || n != base {
				t.Errorf("after its removal: %d objects (%v), want %d", n, err, base)
			}
		})
	}
}

func errnoErr(e unix.Errno) error {
	if e == 0 {
		return nil
	}
	return e
}

// TestMqueueListable: where queues can be made, only an mqueue file system
// shows them; a folder that is not one fails the check, and the probe
// leaves no queue behind.
func TestMqueueListable(t *testing.T) {
	err := mqueueListable(t.TempDir())
	if err == nil || !strings.Contains(err.Error(), "not listed") {
		t.Fatalf("a plain folder: %v", err)
	}
	dir := t.TempDir()
	if err := unix.Mount("mqueue", dir, "mqueue", 0, ""); err != nil {
		t.Fatalf("mount an mqueue file system: %v", err)
	}
	defer unix.Unmount(dir, 0)
	if err := mqueueListable(dir); err != nil {
		t.Errorf("an mqueue file system: %v", err)
	}
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), "runbox-probe-") {
			t.Errorf("the probe left %s", e.Name())
		}
	}
}

// TestDenyMqOpen: under the filter mq_open is refused, to the process and
// to what it starts, and mqueueListable accepts a sandbox without an
// mqueue file system. It runs in a child process of its own: a filter
// cannot be removed.
func TestDenyMqOpen(t *testing.T) {
	if os.Getenv("RUNBOX_TEST_DENY_MQ") == "1" {
		if err := denyMqOpen(); err != nil {
			t.Fatal(err)
		}
		if err := mqueueListable(t.TempDir()); err != nil {
			t.Fatalf("under the filter: %v", err)
		}
		out, err := exec.Command("python3", "-c", `import ctypes, os
rt = ctypes.CDLL("librt.so.1", use_errno=True)
print(rt.mq_open(b"/runbox-child", os.O_CREAT | os.O_RDWR, 0o600, None), ctypes.get_errno())`).CombinedOutput()
		if err != nil || strings.TrimSpace(string(out)) != "-1 1" {
			t.Fatalf("a child's mq_open: %q %v, want -1 EPERM", out, err)
		}
		return
	}
	cmd := exec.Command(os.Args[0], "-test.run=^TestDenyMqOpen$", "-test.v")
	cmd.Env = append(os.Environ(), "RUNBOX_TEST_DENY_MQ=1")
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "--- PASS: TestDenyMqOpen") {
		t.Fatalf("in a child: %v\n%s", err, out)
	}
}
