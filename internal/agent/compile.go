package agent

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// Compiled languages (Config.Compile) run in two phases: the compiler,
// then the program it built. The compiler's exit decides the run when it
// fails (Exit.Phase "compile", its exit code, its messages in the run's
// output); otherwise the program runs (Phase "run").
//
// What the compiler builds is cached in the sandbox, under
// Config.ExecDir: a tmpfs the executor mounts without noexec (/tmp is
// noexec), counted in the sandbox's memory, wiped by a reset and gone with
// the container. An entry is named by the hash of the source, the compile
// command and the run's environment (which a compiler may read), so that a
// program sent again (a retry) runs without the compiler. The compiler's
// own output is kept with the entry and replayed on a hit: a cached
// program shows the warnings it was built with. Entries are made under a
// temporary name and renamed into place once the compiler succeeded;
// the oldest go first when the cache passes half of ExecDir's size.

// Values of Exit.Phase.
const (
	PhaseCompile = "compile"
	PhaseRun     = "run"
)

// Placeholders in Config.Compile and Config.Launch.
const (
	placeholderSrc = "{src}" // the program's file name, in Scratch
	placeholderOut = "{out}" // the folder the compiler writes to
)

// Files of a cache entry holding the compiler's output.
const (
	compileStdout = ".compile.stdout"
	compileStderr = ".compile.stderr"
)

// errStopped reports a run stopped before its next phase began.
var errStopped = errors.New("stopped")

// compiledRun runs the compile phase (unless the cache has the program)
// and then the program, in p. stdio are the program's stdin, stdout and
// stderr; they are closed once the program has started (or the run
// ended without it). It returns how the phase that ended the run ended.
func (st *starter) compiledRun(p *process, run Run, env []string, stdio [3]*os.File) (syscall.WaitStatus, string) {
	defer closeAll(stdio[:]...)
	cfg := st.cfg
	src := "main." + cfg.Ext
	cache := filepath.Join(cfg.ExecDir, "cache")
	key := cacheKey(run, cfg.Compile)
	dir := filepath.Join(cache, key)
	if _, err := os.Stat(dir); err == nil {
		// A hit: it counts as used now, for the eviction.
		now := time.Now()
		_ = os.Chtimes(dir, now, now)
	} else {
		ws, err := st.compile(p, cache, key, src, env, stdio)
		if err != nil {
			return failStart(stdio[2], err, PhaseCompile)
		}
		if !ws.Exited() || ws.ExitStatus() != 0 {
			return ws, PhaseCompile
		}
	}
	replay(dir, stdio)
	argv := expand(cfg.Launch, filepath.Join(cfg.Scratch, src), dir)
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Dir = cfg.Dir
	cmd.Env = env
	cmd.Stdin, cmd.Stdout, cmd.Stderr = stdio[0], stdio[1], stdio[2]
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Credential: cfg.User}
	ended, err := p.launch(st.waiter, cmd)
	if err != nil {
		return failStart(stdio[2], err, PhaseRun)
	}
	closeAll(stdio[:]...) // the program holds its own copies
	return <-ended, PhaseRun
}

// compile builds the program into a new cache entry. The compiler's
// output goes to files in the entry, which are replayed into the run's
// output whether it succeeded or not; a failed build leaves no entry.
func (st *starter) compile(p *process, cache, key, src string, env []string, stdio [3]*os.File) (syscall.WaitStatus, error) {
	if err := os.MkdirAll(cache, 0o700); err != nil {
		return 0, fmt.Errorf("prepare the build cache: %w", err)
	}
	prune(cache, cacheBudget(st.cfg.ExecDir))
	tmp, err := os.MkdirTemp(cache, key+".tmp-")
	if err != nil {
		return 0, fmt.Errorf("prepare the build cache: %w", err)
	}
	defer os.RemoveAll(tmp) // renamed away on success
	if u := st.cfg.User; u != nil {
		// The agent runs apart from programs (gVisor): the compiler, as
		// the programs' user, writes the entry.
		if err := os.Chown(tmp, int(u.Uid), int(u.Gid)); err != nil {
			return 0, fmt.Errorf("prepare the build cache: %w", err)
		}
	}
	stdout, err := os.Create(filepath.Join(tmp, compileStdout))
	if err != nil {
		return 0, err
	}
	defer stdout.Close()
	stderr, err := os.Create(filepath.Join(tmp, compileStderr))
	if err != nil {
		return 0, err
	}
	defer stderr.Close()
	argv := expand(st.cfg.Compile, src, tmp)
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Dir = st.cfg.Scratch
	cmd.Env = env
	cmd.Stdout, cmd.Stderr = stdout, stderr // stdin: /dev/null
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Credential: st.cfg.User}
	ended, err := p.launch(st.waiter, cmd)
	if err != nil {
		return 0, err
	}
	ws := <-ended
	// Whatever the compiler left running goes with it.
	_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	ok := ws.Exited() && ws.ExitStatus() == 0
	dir := filepath.Join(cache, key)
	if ok {
		if err := os.Rename(tmp, dir); err != nil {
			return 0, fmt.Errorf("keep the compiled program: %w", err)
		}
		return ws, nil
	}
	replay(tmp, stdio)
	return ws, nil
}

// replay copies the compiler's output kept in dir into the run's stdout
// and stderr.
func replay(dir string, stdio [3]*os.File) {
	for i, name := range []string{compileStdout, compileStderr} {
		f, err := os.Open(filepath.Join(dir, name))
		if err != nil {
			continue
		}
		_, _ = io.Copy(stdio[i+1], f)
		f.Close()
	}
}

// failStart reports a phase that could not start as a failed run: the
// reason in its stderr, exit status 127 as a shell gives a command it
// cannot run.
func failStart(stderr *os.File, err error, phase string) (syscall.WaitStatus, string) {
	if errors.Is(err, errStopped) {
		return syscall.WaitStatus(syscall.SIGKILL), phase
	}
	fmt.Fprintf(stderr, "runbox: %v\n", err)
	return syscall.WaitStatus(127 << 8), phase
}

// cacheKey names a program's cache entry: the hash of its source, the
// compile command and its environment.
func cacheKey(run Run, compile []string) string {
	h := sha256.New()
	for _, s := range compile {
		fmt.Fprintf(h, "%d:%s", len(s), s)
	}
	keys := make([]string, 0, len(run.Env))
	for k := range run.Env {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	for _, k := range keys {
		fmt.Fprintf(h, "%d:%s=%d:%s", len(k), k, len(run.Env[k]), run.Env[k])
	}
	fmt.Fprintf(h, "%d:%s", len(run.Code), run.Code)
	return hex.EncodeToString(h.Sum(nil))[:32]
}

// expand replaces the placeholders in a command; a command without any
// gets the source's path appended, as a Launch without a compiler does.
func expand(argv []string, src, out string) []string {
	res := make([]string, len(argv))
	found := false
	for i, a := range argv {
		found = found || strings.Contains(a, placeholderSrc) || strings.Contains(a, placeholderOut)
		res[i] = strings.ReplaceAll(strings.ReplaceAll(a, placeholderSrc, src), placeholderOut, out)
	}
	if !found {
		res = append(res, src)
	}
	return res
}

// cacheBudget is the most the build cache may hold: half of the exec
// folder's file system, the rest being room for a build under way.
func cacheBudget(dir string) int64 {
	var s unix.Statfs_t
	if err := unix.Statfs(dir, &s); err != nil {
		return 0
	}
	return int64(s.Blocks) * s.Bsize / 2
}

// prune removes the least recently used entries of the cache, and any
// a build left half made, until the cache holds at most budget bytes.
func prune(cache string, budget int64) {
	entries, err := os.ReadDir(cache)
	if err != nil {
		return
	}
	type entry struct {
		path string
		used time.Time
		size int64
	}
	var all []entry
	var total int64
	for _, e := range entries {
		path := filepath.Join(cache, e.Name())
		info, err := e.Info()
		if err != nil {
			continue
		}
		if strings.Contains(e.Name(), ".tmp-") || !info.IsDir() {
			_ = os.RemoveAll(path)
			continue
		}
		size := treeSize(path)
		all = append(all, entry{path, info.ModTime(), size})
		total += size
	}
	slices.SortFunc(all, func(a, b entry) int { return a.used.Compare(b.used) })
	for _, e := range all {
		if total <= budget {
			return
		}
		_ = os.RemoveAll(e.path)
		total -= e.size
	}
}

// treeSize adds up the sizes of the files under path.
func treeSize(path string) int64 {
	var n int64
	_ = filepath.WalkDir(path, func(_ string, d fs.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			if info, err := d.Info(); err == nil {
				n += info.Size()
			}
		}
		return nil
	})
	return n
}
