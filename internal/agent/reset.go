package agent

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// A reset readies a sandbox for another conversation: the executor hands
// idle sandboxes to new conversations instead of starting containers. It
// leaves nothing of the conversation that used the sandbox: no process
// (the zygote and the kept interpreter included; a fresh zygote is spawned
// from the template afterwards, see zygote.go), no file where a program
// can write (Config.Wipe: the root file system is read-only, and /data is
// the executor's to empty), no System V IPC object, no POSIX message queue
// (/dev/mqueue is wiped, or, where there is none, none can be made: see
// mqueue.go), and no process attribute a program could change in the
// agent or the template, the two processes that outlive it (see
// attrs.go), and only while programs cannot reach the agent's descriptors
// (descriptorsHidden). Each is checked once done, and the reset reports Clean only
// if every check passed: the executor removes a sandbox that is not. The
// agent's own state holds nothing a program gave it but what the next run
// replaces.

// reset runs between runs, from the frame loop.
func (st *starter) reset() Reset {
	if !st.cfg.ownsSandbox() {
		return Reset{Reason: "this agent does not own its sandbox"}
	}
	if !descriptorsHidden(st.cfg.programUID()) {
		// Every other check would pass: what a program could have done
		// through the agent's descriptors cannot be undone or seen.
		return Reset{Reason: "this kernel shows the agent's descriptors to programs"}
	}
	// The zygote first, before taking busy: it takes busy to start.
	if z := st.zygote; z != nil {
		z.stop()
		<-z.done
		st.zygote = nil
	}
	st.busy.Lock()
	if st.kernel != nil {
		st.kernel.kill()
		st.kernel = nil
	}
	st.dropPrestarted()
	st.preloaded = false
	r := Reset{Clean: true}
	fail := func(format string, args ...any) {
		if r.Clean {
			r = Reset{Reason: fmt.Sprintf(format, args...)}
		}
	}
	st.clear(fail)
	replace := st.checkTemplate(fail)
	if r.Clean && st.cfg.Skel != "" {
		if err := CopyTree(st.cfg.Skel, "/tmp", st.cfg.User); err != nil {
			fail("restore caches: %v", err)
		}
	}
	st.busy.Unlock()
	if replace {
		// Without busy: a template being restarted waits for it.
		st.template.stop()
		<-st.template.done
		st.template = nil
	}
	st.startZygote()
	if r.Clean {
		st.prestart()
	}
	return r
}

// clear leaves nothing of the conversation in the sandbox: no process but
// the template, no file where a program can write, no IPC object, no
// attribute of the agent's changed. It tells fail each check that did not
// pass. busy is held.
func (st *starter) clear(fail func(format string, args ...any)) {
	spare := st.templatePIDs()
	if !sweep(spare, nil) {
		fail("processes are left")
	}
	for _, dir := range st.cfg.Wipe {
		if err := wipe(dir); err != nil {
			fail("%s: %v", dir, err)
		}
	}
	if n, err := sysvObjects(); err != nil || n > 0 {
		fail("System V IPC objects are left (%d, %v)", n, err)
	}
	if err := mqueueListable(mqueueDir); err != nil {
		fail("%v", err)
	}
	// Nothing can have started since the sweep (no program runs, busy is
	// held), but the check is cheap and a reset must not assume.
	if !sweep(spare, nil) {
		fail("processes are left")
	}
	if err := st.attrs.check(0); err != nil {
		fail("the agent's %v", err)
	}
}

// checkTemplate checks the template, and reports whether it must be
// replaced. A program may have ended the template (a new one starts) or
// stopped it (it is continued); one it changed makes the sandbox unfit
// (fail).
func (st *starter) checkTemplate(fail func(format string, args ...any)) (replace bool) {
	t := st.template
	if t == nil {
		return false
	}
	pid := t.processID()
	if pid > 0 {
		_ = syscall.Kill(pid, syscall.SIGCONT)
		if err := st.attrs.check(pid); err != nil {
			fail("the template's %v", err)
		}
	}
	return pid == 0 || !t.waitReady(0)
}

// startZygote starts the zygote, if the agent has one: spawned from the
// template, which is started first if it is not running.
func (st *starter) startZygote() {
	if len(st.cfg.Zygote) == 0 {
		return
	}
	if st.template == nil {
		st.template = newZygote(st.cfg.Zygote, st.cfg.Env, st.cfg.User, st.waiter, &st.busy, nil)
		go st.template.run()
	}
	st.zygote = newZygote(st.cfg.Zygote, st.cfg.Env, st.cfg.User, st.waiter, &st.busy, st.template)
	go st.zygote.run()
}

// templatePIDs returns the template's pid, which a sweep must spare.
func (st *starter) templatePIDs() []int {
	if st.template == nil {
		return nil
	}
	return []int{st.template.processID()}
}

// wipe removes everything in dir and checks that nothing is left. A folder
// a program made unreadable or unwritable (its own, so ours) is opened up
// first.
func wipe(dir string) error {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	for _, e := range entries {
		p := filepath.Join(dir, e.Name())
		if os.RemoveAll(p) != nil {
			openUp(p)
			_ = os.RemoveAll(p)
		}
	}
	left, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	if len(left) > 0 {
		return fmt.Errorf("%d entries could not be removed", len(left))
	}
	return nil
}

// openUp makes a folder tree readable and writable by its owner.
func openUp(p string) {
	fi, err := os.Lstat(p)
	if err != nil || !fi.IsDir() {
		return
	}
	_ = os.Chmod(p, 0o700)
	entries, _ := os.ReadDir(p)
	for _, e := range entries {
		openUp(filepath.Join(p, e.Name()))
	}
}

// sysvObjects counts the System V shared memory segments, semaphore sets
// and message queues of the sandbox's IPC namespace, as the kernel's own
// counters say (shmctl SHM_INFO, semctl SEM_INFO, msgctl MSG_INFO): gVisor
// has no /proc/sysvipc to list them by, and these answer under either
// kernel without any permission on the objects.
func sysvObjects() (int, error) {
	const (
		shmInfo = 14 // SHM_INFO: struct shm_info, used_ids first
		semInfo = 19 // SEM_INFO: struct seminfo, semusz eighth
		msgInfo = 12 // MSG_INFO: struct msginfo, msgpool first
	)
	var buf [16]int32 // larger than any of the three structs
	p := uintptr(unsafe.Pointer(&buf[0]))
	n := 0
	for _, q := range []struct {
		trap, a1, a2, a3, a4 uintptr
		field                int
	}{
		{unix.SYS_SHMCTL, 0, shmInfo, p, 0, 0},
		{unix.SYS_SEMCTL, 0, 0, semInfo, p, 7},
		{unix.SYS_MSGCTL, 0, msgInfo, p, 0, 0},
	} {
		buf = [16]int32{}
		if _, _, errno := unix.Syscall6(q.trap, q.a1, q.a2, q.a3, q.a4, 0, 0); errno != 0 {
			return 0, errno
		}
		n += int(buf[q.field])
	}
	return n, nil
}

// descriptorsHidden reports whether the agent's descriptors are out of
// reach of programs, which run as uid: its /proc/<pid>/fd belongs to
// another user. Linux gives a non-dumpable process's to root; gVisor's
// (Debian's 2022 release) leaves them the process's own user's, so there
// only an agent that runs as another user than programs (Config.User)
// keeps its stdin and stdout, the executor's frames, to itself. Call it
// after PR_SET_DUMPABLE(0).
func descriptorsHidden(uid int) bool {
	var st unix.Stat_t
	return unix.Stat("/proc/self/fd", &st) == nil && int(st.Uid) != uid
}

// CopyTree copies regular files and folders from src into dst, given to
// owner if set.
func CopyTree(src, dst string, owner *syscall.Credential) error {
	return filepath.WalkDir(src, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(src, path)
		if err != nil {
			return err
		}
		target := filepath.Join(dst, rel)
		switch {
		case d.IsDir():
			err = os.MkdirAll(target, 0o700)
		case d.Type().IsRegular():
			var b []byte
			if b, err = os.ReadFile(path); err == nil {
				err = os.WriteFile(target, b, 0o600)
			}
		default:
			return nil
		}
		if err == nil && owner != nil {
			err = os.Lchown(target, int(owner.Uid), int(owner.Gid))
		}
		return err
	})
}
