package agent

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// startPythonAgent runs Serve with the Python zygote of runners/python on
// this host, and waits until programs are forked from it.
func startPythonAgent(t *testing.T) *Conn {
	t.Helper()
	py, err := exec.LookPath("python3")
	if err != nil {
		t.Fatal("python3 is needed to test the zygote")
	}
	_, file, _, _ := runtime.Caller(0)
	zygote := filepath.Join(filepath.Dir(file), "..", "..", "runners", "python", "zygote.py")
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	ctx, cancel := context.WithCancel(context.Background())
	cfg := Config{
		Launch:      []string{py},
		Ext:         "py",
		Dir:         t.TempDir(),
		Scratch:     t.TempDir(),
		Env:         []string{"PATH=" + os.Getenv("PATH"), "PYTHONUNBUFFERED=1", "BASE=base"},
		Zygote:      []string{py, zygote},
		Preload:     "decimal,fractions",
		PreloadWhen: regexp.MustCompile(`\bdecimal\b`),
	}
	done := make(chan error, 1)
	go func() { done <- Serve(ctx, cfg, inR, outW); outW.Close() }()
	t.Cleanup(func() {
		inW.Close()
		<-done
		cancel()
	})
	c := NewConn(outR, inW)
	if _, err := c.Hello(); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		o := runOnce(t, c, Run{Code: "import os\nprint(open(f'/proc/{os.getppid()}/cmdline').read())"}, "")
		if strings.Contains(o.stdout, "zygote.py") {
			return c
		}
		if time.Now().After(deadline) {
			t.Fatalf("programs are not forked from the zygote: parent %q", o.stdout)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func runOnce(t *testing.T, c *Conn, run Run, stdin string) outcome {
	t.Helper()
	if err := c.Start(run); err != nil {
		t.Fatal(err)
	}
	c.Stdin([]byte(stdin))
	c.CloseStdin()
	return collect(t, c)
}

// TestZygoteKeepsProgramSemantics: a forked program behaves as if started
// with python3.
func TestZygoteKeepsProgramSemantics(t *testing.T) {
	c := startPythonAgent(t)
	tests := []struct {
		name, code, stdin string
		wantOut, wantErr  string
		notErr            string
		wantCode          int
	}{
		{name: "main module", code: "import sys\nprint(__name__, sys.argv[0].endswith('main.py'), __file__ == sys.argv[0])", wantOut: "__main__ True True\n"},
		{name: "working directory", code: "import os\nprint(os.path.isdir(os.getcwd()), os.getcwd().endswith('main.py'))", wantOut: "True False\n"},
		{name: "exit code", code: "import sys\nsys.exit(3)", wantCode: 3},
		{name: "exit message", code: "raise SystemExit('bye')", wantErr: "bye", wantCode: 1},
		{name: "traceback without zygote frames", code: "def f():\n    raise ValueError('boom')\nf()",
			wantErr: "line 2, in f", notErr: "zygote", wantCode: 1},
		{name: "environment", code: "import os\nprint(os.environ['BASE'], os.environ['X'])", wantOut: "base x\n"},
		{name: "stdin", code: "print(input().upper())", stdin: "hi\n", wantOut: "HI\n"},
		{name: "atexit", code: "import atexit\natexit.register(lambda: print('bye'))\nprint('hi')", wantOut: "hi\nbye\n"},
		{name: "threads finish", code: "import threading, time\nthreading.Thread(target=lambda: (time.sleep(0.2), print('late'))).start()", wantOut: "late\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			o := runOnce(t, c, Run{Code: tt.code, Env: map[string]string{"X": "x"}}, tt.stdin)
			if o.failed != "" {
				t.Fatal(o.failed)
			}
			if o.stdout != tt.wantOut || !strings.Contains(o.stderr, tt.wantErr) || o.exit.ExitCode != tt.wantCode {
				t.Errorf("stdout %q stderr %q exit %d; want %q, %q, %d", o.stdout, o.stderr, o.exit.ExitCode, tt.wantOut, tt.wantErr, tt.wantCode)
			}
			if tt.notErr != "" && strings.Contains(o.stderr, tt.notErr) {
				t.Errorf("stderr shows %q: %s", tt.notErr, o.stderr)
			}
		})
	}
	t.Run("fresh globals and seeds each run", func(t *testing.T) {
		a := runOnce(t, c, Run{Code: "import random\nleak = 1\nprint(random.random())"}, "")
		b := runOnce(t, c, Run{Code: "import random\nprint('leak' in globals())\nprint(random.random())"}, "")
		lines := strings.Split(b.stdout, "\n")
		if lines[0] != "False" || strings.TrimSpace(a.stdout) == lines[1] {
			t.Errorf("second run saw %q after %q", b.stdout, a.stdout)
		}
	})
	t.Run("preload on demand", func(t *testing.T) {
		o := runOnce(t, c, Run{Code: "import sys\nprint('fractions' in sys.modules)"}, "")
		if o.stdout != "False\n" {
			t.Fatalf("before any program needed it, fractions was imported: %q", o.stdout)
		}
		// This program mentions decimal: the zygote imports the preload
		// first, and it and every later program find it imported.
		o = runOnce(t, c, Run{Code: "import sys\nprint('fractions' in sys.modules)  # decimal"}, "")
		o2 := runOnce(t, c, Run{Code: "import sys\nprint('fractions' in sys.modules)"}, "")
		if o.stdout != "True\n" || o2.stdout != "True\n" {
			t.Errorf("after the preload: %q, %q", o.stdout, o2.stdout)
		}
	})
	t.Run("kill", func(t *testing.T) {
		if err := c.Start(Run{Code: "import time\nprint('up', flush=True)\ntime.sleep(60)"}); err != nil {
			t.Fatal(err)
		}
		c.CloseStdin()
		if m, err := c.Recv(); err != nil || !strings.HasPrefix(string(m.Data), "up") {
			t.Fatalf("%+v %v", m, err)
		}
		c.Kill()
		if o := collect(t, c); o.exit.Signal != 9 {
			t.Errorf("exit %+v", o.exit)
		}
	})
}

// newTestZygote starts a template of runners/python/zygote.py and a
// zygote spawned from it.
func newTestZygote(t *testing.T) (tmpl, z *zygote, env []string) {
	t.Helper()
	py, err := exec.LookPath("python3")
	if err != nil {
		t.Fatal("python3 is needed to test the zygote")
	}
	_, file, _, _ := runtime.Caller(0)
	command := []string{py, filepath.Join(filepath.Dir(file), "..", "..", "runners", "python", "zygote.py")}
	env = []string{"PATH=" + os.Getenv("PATH")}
	busy := new(sync.Mutex)
	tmpl = newZygote(command, env, nil, plainWaiter{}, busy, nil)
	go tmpl.run()
	z = newZygote(command, env, nil, plainWaiter{}, busy, tmpl)
	go z.run()
	t.Cleanup(func() {
		z.stop()
		tmpl.stop()
		<-z.done
		<-tmpl.done
	})
	if !z.awaitReady(20 * time.Second) {
		t.Fatal("the zygote is not ready")
	}
	return tmpl, z, env
}

// parentOf reads a process's parent from /proc.
func parentOf(t *testing.T, pid int) int {
	t.Helper()
	_, ppid, ok := procStat(pid)
	if !ok || ppid == 0 {
		t.Fatalf("no parent of %d", pid)
	}
	return ppid
}

// stopped waits for a zygote's stop to complete.
func stopped(t *testing.T, z *zygote) {
	t.Helper()
	z.stop()
	select {
	case <-z.done:
	case <-time.After(10 * time.Second):
		t.Fatal("a stopped zygote does not end")
	}
}

// TestZygoteSpawnedFromTemplate: the zygote is a fork of the template, a
// zygote stopped with a kernel of its own ends, and the next one is
// spawned anew from the same template.
func TestZygoteSpawnedFromTemplate(t *testing.T) {
	tmpl, z, env := newTestZygote(t)
	if got := parentOf(t, z.processID()); got != tmpl.processID() {
		t.Fatalf("the zygote's parent is %d, not the template %d", got, tmpl.processID())
	}
	k, err := startKernel(z, t.TempDir(), env)
	if err != nil {
		t.Fatal(err)
	}
	defer k.kill()
	first := z.processID()
	stopped(t, z)

	next := newZygote(z.command, env, nil, plainWaiter{}, z.busy, tmpl)
	go next.run()
	defer stopped(t, next)
	if !next.awaitReady(10 * time.Second) {
		t.Fatal("the next zygote is not ready")
	}
	if pid := next.processID(); pid == first || parentOf(t, pid) != tmpl.processID() {
		t.Fatalf("the next zygote %d (the first was %d) is not the template's", pid, first)
	}
	stopped(t, tmpl)
}

// TestZygoteTemplateStopped: a template a program stopped is continued,
// and spawns the next zygote.
func TestZygoteTemplateStopped(t *testing.T) {
	tmpl, z, env := newTestZygote(t)
	stopped(t, z)
	if err := syscall.Kill(tmpl.processID(), syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	next := newZygote(z.command, env, nil, plainWaiter{}, z.busy, tmpl)
	go next.run()
	defer stopped(t, next)
	if !next.awaitReady(20 * time.Second) {
		t.Fatal("the zygote is not ready")
	}
	if got := parentOf(t, next.processID()); got != tmpl.processID() {
		t.Fatalf("the zygote's parent is %d, not the template %d", got, tmpl.processID())
	}
}

// TestZygoteEndsWithTemplateStopped: a zygote spawned from the template
// is the template's child, whose end the template reports; a program that
// stopped the template (SIGSTOP) must not keep the zygote's stop — which
// a reset waits for — from ending.
func TestZygoteEndsWithTemplateStopped(t *testing.T) {
	tmpl, z, _ := newTestZygote(t)
	if got := parentOf(t, z.processID()); got != tmpl.processID() {
		t.Fatalf("the zygote's parent is %d, not the template %d", got, tmpl.processID())
	}
	if err := syscall.Kill(tmpl.processID(), syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	z.stop()
	select {
	case <-z.done:
	case <-time.After(10 * time.Second):
		t.Fatal("the zygote's end waits for a stopped template")
	}
}

// TestZygoteTemplateSilent: a template that does not answer a spawn is
// ended, and the zygote is started the ordinary way.
func TestZygoteTemplateSilent(t *testing.T) {
	_, z, env := newTestZygote(t)
	silent := newZygote([]string{z.command[0], "-c", `import socket, time
s = socket.socket(fileno=3)  # kept: closed, it would end the template
s.send(b'{"ready": true}')
time.sleep(60)`}, env, nil, plainWaiter{}, z.busy, nil)
	go silent.run()
	defer stopped(t, silent)
	if !silent.awaitReady(20 * time.Second) {
		t.Fatal("the silent template is not ready")
	}
	next := newZygote(z.command, env, nil, plainWaiter{}, z.busy, silent)
	go next.run()
	defer stopped(t, next)
	if !next.awaitReady(20 * time.Second) {
		t.Fatal("the zygote is not ready")
	}
	if parentOf(t, next.processID()) != os.Getpid() {
		t.Fatal("the zygote was not started by the agent")
	}
	select {
	case <-silent.done:
	case <-time.After(10 * time.Second):
		t.Fatal("the template that did not answer was not ended")
	}
}

// TestZygoteForksAhead: once a run is over, the zygote holds the next
// programs' processes forked already (aheadDepth of them from its second
// run on), the oldest of which the next run becomes: a program finds
// only the others, which wait as the zygote does, not dumpable; a kept-state cell finds none;
// and one that was ended, interrupted or stopped costs the next run
// nothing but the fork.
func TestZygoteForksAhead(t *testing.T) {
	c := startPythonAgent(t)
	run := func(code string) string {
		t.Helper()
		o := runOnce(t, c, Run{Code: code}, "")
		if o.failed != "" || o.exit.ExitCode != 0 {
			t.Fatalf("%q: %+v", code, o)
		}
		return o.stdout
	}
	zygote, err := strconv.Atoi(strings.TrimSpace(run("import os\nprint(os.getppid())")))
	if err != nil {
		t.Fatal(err)
	}
	// aheads waits for the zygote's waiting children, oldest first: it
	// has served two runs (startPythonAgent's and the one above) or more.
	aheads := func() []int {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for {
			if kids := childrenOf(t, zygote); len(kids) == aheadDepth {
				slices.Sort(kids)
				return kids
			} else if time.Now().After(deadline) {
				t.Fatalf("the zygote's children: %v; want the %d forked ahead", kids, aheadDepth)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	// probe prints its pid and the zygote's other children.
	probe := `import os
def parent(p):
    try:
        return int(open(f'/proc/{p}/stat').read().rsplit(')', 1)[1].split()[1])
    except OSError:  # a host's process that ended meanwhile
        return 0
z = os.getppid()
others = sorted(int(p) for p in os.listdir('/proc') if p.isdigit() and int(p) != os.getpid() and parent(p) == z)
print(os.getpid(), others)`
	want := func(pid int, others []int) string {
		return fmt.Sprintf("%d %s\n", pid, strings.ReplaceAll(fmt.Sprint(others), " ", ", "))
	}
	for range 3 {
		kids := aheads()
		if got := run(probe); got != want(kids[0], kids[1:]) {
			t.Fatalf("the run printed %q; want %q: the oldest forked ahead, and the others only", got, want(kids[0], kids[1:]))
		}
	}
	if os.Getuid() != 0 { // root reads any process's environment
		for _, pid := range aheads() {
			if _, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid)); err == nil {
				t.Error("a process forked ahead is dumpable")
			}
		}
	}
	for _, sig := range []syscall.Signal{syscall.SIGINT, syscall.SIGTERM, syscall.SIGHUP, syscall.SIGSTOP, syscall.SIGKILL} {
		kids := aheads()
		if err := syscall.Kill(kids[0], sig); err != nil {
			t.Fatal(err)
		}
		if sig != syscall.SIGKILL {
			if got := run("print('next')"); got != "next\n" {
				t.Errorf("after %v to the process forked ahead, the next run printed %q", sig, got)
			}
			continue
		}
		for slices.Contains(childrenOf(t, zygote), kids[0]) {
			time.Sleep(time.Millisecond) // a kill the request could outrun
		}
		// The next one forked ahead takes the run.
		if got, _, _ := strings.Cut(run(probe), " "); got != strconv.Itoa(kids[1]) {
			t.Errorf("with the oldest process forked ahead killed, the run was %s; want the next one, %d", got, kids[1])
		}
	}
	// Signals were blocked while it waited: the program has none blocked.
	if got := run("print(open('/proc/self/status').read().split('SigBlk:')[1].split()[0])"); got != "0000000000000000\n" {
		t.Errorf("a program forked ahead starts with signals blocked: %q", got)
	}
	// A kept-state cell does not take one: they are ended before the cell
	// runs, which does not find them.
	aheads()
	cell := runOnce(t, c, Run{KeepState: true, Code: probe}, "")
	if !strings.HasSuffix(cell.stdout, " []\n") {
		t.Errorf("a kept-state cell found %q", cell.stdout)
	}
}

// TestZygoteExitReport: a process forked ahead tells the agent its exit
// code itself; the agent takes it only once the process has exited, and
// the zygote's status where the process sent none it can read (a signal,
// os._exit, garbage). A code a program forges on that socket is its own
// exit code to choose (taken, or the one it exits with, whichever the
// agent has first): its run still lasts until the process ends.
func TestZygoteExitReport(t *testing.T) {
	c := startPythonAgent(t)
	// forge writes msg on the process's socket to the agent.
	forge := func(msg string) string {
		return fmt.Sprintf(`import os, stat
for f in os.listdir('/proc/self/fd'):
    try:
        if int(f) > 2 and stat.S_ISSOCK(os.fstat(int(f)).st_mode):
            os.write(int(f), b%q)
    except OSError:
        pass
`, msg)
	}
	tests := []struct {
		name, code       string
		wantOut          string
		wantCode, signal int
		orCodes          []int // others it may end with
		atLeast          time.Duration
	}{
		{name: "reported", code: "import sys\nsys.exit(3)", wantCode: 3},
		{name: "exception", code: "raise ValueError()", wantCode: 1},
		{name: "signal", code: "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)", wantCode: -1, signal: 9},
		{name: "os._exit", code: "import os\nos._exit(5)", wantCode: 5},
		{name: "garbage", code: forge("nonsense") + "raise SystemExit(4)", wantCode: 4},
		{name: "out of range", code: forge(`{"exit": 999}`) + "raise SystemExit(4)", wantCode: 4},
		{name: "forged, then runs on", code: forge(`{"exit": 7}`) + "import time\ntime.sleep(0.3)\nprint('after')",
			wantOut: "after\n", wantCode: 7, orCodes: []int{0}, atLeast: 300 * time.Millisecond},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			start := time.Now()
			o := runOnce(t, c, Run{Code: tt.code}, "")
			took := time.Since(start)
			code := o.exit.ExitCode
			if o.failed != "" || (code != tt.wantCode && !slices.Contains(tt.orCodes, code)) || o.exit.Signal != tt.signal || o.stdout != tt.wantOut {
				t.Errorf("got %+v; want exit %d, signal %d, stdout %q", o, tt.wantCode, tt.signal, tt.wantOut)
			}
			if took < tt.atLeast {
				t.Errorf("the run took %v; its process ran %v", took, tt.atLeast)
			}
		})
	}
}

// TestZygoteAheadDepth: a zygote keeps aheadFirst processes forked ahead
// until it has served two runs, aheadDepth from then on.
func TestZygoteAheadDepth(t *testing.T) {
	_, z, _ := newTestZygote(t)
	depth := func() int {
		z.mu.Lock()
		defer z.mu.Unlock()
		return len(z.aheads)
	}
	for run, want := range []int{aheadFirst, aheadFirst, aheadDepth, aheadDepth} {
		if run > 0 {
			z.forkAhead() // as after the sweep of a run forked from it
		}
		if got := depth(); got != want {
			t.Fatalf("after %d runs the zygote keeps %d forked ahead; want %d", run, got, want)
		}
	}
}

// TestZygoteSpares: a sweep spares the processes forked ahead, waiting
// for those being forked, and nothing else: neither another child of the
// zygote (a program makes one with CLONE_PARENT) nor any other process.
func TestZygoteSpares(t *testing.T) {
	clone, ok := map[string]int{"amd64": 56, "arm64": 220}[runtime.GOARCH]
	if !ok {
		t.Fatalf("no clone system call number for %s", runtime.GOARCH)
	}
	_, z, env := newTestZygote(t)
	known := func() []int {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for {
			z.mu.Lock()
			var pids []int
			for _, a := range z.aheads {
				if a.pid > 0 {
					pids = append(pids, a.pid)
				}
			}
			z.mu.Unlock()
			if len(pids) == aheadFirst { // a zygote that has served no run
				return pids
			}
			if time.Now().After(deadline) {
				t.Fatalf("processes forked ahead: %v", pids)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	for _, pid := range known() {
		if !z.spares(pid) {
			t.Errorf("a sweep would kill %d, forked ahead", pid)
		}
	}
	// A program makes a child of the zygote that is not one of them.
	dir := t.TempDir()
	path := filepath.Join(dir, "main.py")
	code := fmt.Sprintf(`import ctypes, os, time
pid = ctypes.CDLL(None).syscall(%d, 0x8000 | 17, 0, 0, 0, 0)  # CLONE_PARENT | SIGCHLD
if pid == 0:
    time.sleep(30)
    os._exit(0)
print(pid, flush=True)
`, clone)
	if err := os.WriteFile(path, []byte(code), 0o600); err != nil {
		t.Fatal(err)
	}
	outR, outW, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	null, err := os.Open(os.DevNull)
	if err != nil {
		t.Fatal(err)
	}
	defer null.Close()
	f, err := z.fork(forkRequest{Path: path, Dir: dir, Env: env}, []*os.File{null, outW, os.Stderr})
	outW.Close()
	if err != nil {
		t.Fatal(err)
	}
	<-f.exit
	line, err := bufio.NewReader(outR).ReadString('\n')
	outR.Close()
	sibling, _ := strconv.Atoi(strings.TrimSpace(line))
	if err != nil || sibling <= 0 {
		t.Fatalf("the program printed %q: %v", line, err)
	}
	defer syscall.Kill(sibling, syscall.SIGKILL)
	if got := parentOf(t, sibling); got != z.processID() {
		t.Fatalf("the sibling's parent is %d; want the zygote, %d", got, z.processID())
	}
	// Found while forks ahead are pending, it is judged once they are known.
	z.endAhead()
	z.forkAhead()
	if z.spares(sibling) {
		t.Error("a sweep would spare the zygote's child a program made")
	}
	if z.spares(os.Getpid()) || z.spares(z.processID()) {
		t.Error("a sweep would spare a process not forked ahead")
	}
	for _, pid := range known() {
		if !z.spares(pid) {
			t.Errorf("a sweep would kill %d, forked ahead", pid)
		}
	}
}

// childrenOf returns the processes whose parent is pid.
func childrenOf(t *testing.T, pid int) []int {
	t.Helper()
	entries, err := os.ReadDir("/proc")
	if err != nil {
		t.Fatal(err)
	}
	var kids []int
	for _, e := range entries {
		p, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if state, ppid, ok := procStat(p); ok && ppid == pid && state != 'Z' {
			kids = append(kids, p)
		}
	}
	return kids
}
