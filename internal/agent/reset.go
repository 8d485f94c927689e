package agent

import (
	"bufio"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
)

// A reset readies a sandbox for another conversation: the executor hands
// idle sandboxes to new conversations instead of starting containers. It
// leaves nothing of the conversation that used the sandbox: no process
// (the zygote and the kept interpreter included; a fresh zygote is spawned
// from the template afterwards, see zygote.go), no file where a program
// can write (Config.Wipe: the root file system is read-only, and /data is
// the executor's to empty), no System V IPC object, no POSIX message queue
// (/dev/mqueue is wiped), and no process attribute a program could change
// in the agent or the template, the two processes that outlive it (see
// attrs.go). Each is checked once done, and the reset reports Clean only
// if every check passed: the executor removes a sandbox that is not. The
// agent's own state holds nothing a program gave it but what the next run
// replaces.

// reset runs between runs, from the frame loop.
func (st *starter) reset() Reset {
	if !st.cfg.Sweep || os.Getuid() == 0 {
		return Reset{Reason: "this agent does not own its sandbox"}
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
	spare := st.templatePIDs()
	if !sweep(spare) {
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
	// Nothing can have started since the sweep (no program runs, busy is
	// held), but the check is cheap and a reset must not assume.
	if !sweep(spare) {
		fail("processes are left")
	}
	if err := st.attrs.check(0); err != nil {
		fail("the agent's %v", err)
	}
	// A program may have ended the template (a new one starts) or stopped
	// it (it is continued); one it changed makes the sandbox unfit.
	replace := false
	if t := st.template; t != nil {
		pid := t.processID()
		if pid > 0 {
			_ = syscall.Kill(pid, syscall.SIGCONT)
			if err := st.attrs.check(pid); err != nil {
				fail("the template's %v", err)
			}
		}
		replace = pid == 0 || !t.waitReady(0)
	}
	if r.Clean && st.cfg.Skel != "" {
		if err := CopyTree(st.cfg.Skel, "/tmp"); err != nil {
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

// startZygote starts the zygote, if the agent has one: spawned from the
// template, which is started first if it is not running.
func (st *starter) startZygote() {
	if len(st.cfg.Zygote) == 0 {
		return
	}
	if st.template == nil {
		st.template = newZygote(st.cfg.Zygote, st.cfg.Env, st.waiter, &st.busy, nil)
		go st.template.run()
	}
	st.zygote = newZygote(st.cfg.Zygote, st.cfg.Env, st.waiter, &st.busy, st.template)
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
// and message queues of the sandbox's IPC namespace.
func sysvObjects() (int, error) {
	n := 0
	for _, kind := range []string{"shm", "sem", "msg"} {
		f, err := os.Open("/proc/sysvipc/" + kind)
		if err != nil {
			return 0, err
		}
		sc := bufio.NewScanner(f)
		lines := 0
		for sc.Scan() {
			if strings.TrimSpace(sc.Text()) != "" {
				lines++
			}
		}
		f.Close()
		if err := sc.Err(); err != nil {
			return 0, err
		}
		n += max(lines-1, 0) // the first line is a header
	}
	return n, nil
}

// CopyTree copies regular files and folders from src into dst.
func CopyTree(src, dst string) error {
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
			return os.MkdirAll(target, 0o700)
		case d.Type().IsRegular():
			b, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			return os.WriteFile(target, b, 0o600)
		}
		return nil
	})
}
