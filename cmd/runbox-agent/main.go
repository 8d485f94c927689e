// Command runbox-agent runs inside a sandbox container. It reads programs
// from its stdin in the runner protocol (package agent), runs them one at a
// time, and reports their output and exit on its stdout.
//
// Usage: runbox-agent -ext=py [-sweep] [-skel=DIR] [-zygote=CMD | -prestart | -compile=CMD -exec-dir=DIR] -- LAUNCH...
//
// RUNBOX_USER=uid:gid in its environment starts programs, the zygote and
// its template as that user instead of the agent's own (the executor sets
// it, and starts the agent as root with a few capabilities, under gVisor:
// see agent.Config.User).
//
// runbox-agent -landlock-exec RULES -- PROGRAM... is how the agent starts a
// program it must hold to filesystem rules (agent.LandlockExec).
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"

	"github.com/runbox-dev/runbox/internal/agent"
)

func main() {
	// Started by the agent for a program with filesystem rules: apply
	// them, become the program.
	if len(os.Args) > 1 && os.Args[1] == agent.LandlockFlag {
		err := agent.LandlockExec(os.Args[2:])
		fmt.Fprintln(os.Stderr, "runbox:", err)
		os.Exit(126)
	}
	ext := flag.String("ext", "", "file extension of programs, without the dot")
	dir := flag.String("dir", "/data", "working directory of programs")
	scratch := flag.String("scratch", "/tmp/runbox", "folder the program file is written to")
	sweep := flag.Bool("sweep", false, "kill every other process of the sandbox after each run")
	skel := flag.String("skel", "", "folder whose contents are copied into /tmp at start (caches)")
	zygote := flag.String("zygote", "", "command of a zygote that forks programs, space-separated (e.g. python3 /opt/runbox/zygote.py)")
	preload := flag.String("preload", "", "modules the zygote imports, comma-separated (or, with -prestart, code), once a program matches -preload-when")
	preloadWhen := flag.String("preload-when", "", "regular expression over a program's source that triggers -preload")
	proxy := flag.String("proxy", agent.ProxyAddr, "where programs reach the executor's egress proxy, on the sandbox's loopback; empty: nowhere")
	proxySocket := flag.String("proxy-socket", agent.ProxySocket, "the executor's proxy socket, tried first for connections to the proxy listener; empty: none")
	compile := flag.String("compile", "", "command that builds a program before it runs, space-separated: {src} is its file name, {out} the folder it writes, which LAUNCH names as {out}")
	prestart := flag.Bool("prestart", false, "start each run's process ahead, reading its source from /dev/fd/3 ({src} in LAUNCH); -preload is then code it runs first once a program matched -preload-when")
	prelude := flag.String("prelude", "", "with -prestart: code the pre-started process runs first (it starts in /: e.g. a change to the programs' folder)")
	execDir := flag.String("exec-dir", "", "folder programs may execute files from (a tmpfs without noexec), where compiled programs are cached; a reset wipes it")
	flag.Parse()
	// A compiled language builds each program; a zygote forks it; a
	// pre-started process reads it: one way per image.
	ways := 0
	for _, set := range []bool{*compile != "", *zygote != "", *prestart} {
		if set {
			ways++
		}
	}
	if *ext == "" || flag.NArg() == 0 || (*compile != "" && *execDir == "") || ways > 1 {
		fmt.Fprintln(os.Stderr, "usage: runbox-agent -ext=EXT [-sweep] [-skel=DIR] [-zygote=CMD | -prestart | -compile=CMD -exec-dir=DIR] -- LAUNCH...")
		os.Exit(2)
	}
	// Programs run as the agent's own user. Not dumpable, the agent's
	// /proc entries belong to root: no program can open its stdin or
	// stdout (the executor's frames) through /proc/<pid>/fd, read its
	// memory or trace it.
	if err := unix.Prctl(unix.PR_SET_DUMPABLE, 0, 0, 0, 0); err != nil {
		fmt.Fprintln(os.Stderr, "runbox-agent: prctl(PR_SET_DUMPABLE):", err)
		os.Exit(1)
	}
	user, err := programUser(os.Getenv("RUNBOX_USER"))
	if err != nil {
		fmt.Fprintln(os.Stderr, "runbox-agent: RUNBOX_USER:", err)
		os.Exit(2)
	}
	// Before any child: what the sandbox cannot list, nobody may make.
	if err := agent.DenyMqueuesUnlisted(); err != nil {
		fmt.Fprintln(os.Stderr, "runbox-agent: forbid POSIX message queues:", err)
		os.Exit(1)
	}
	if *skel != "" {
		if err := agent.CopyTree(*skel, "/tmp", user); err != nil {
			fmt.Fprintln(os.Stderr, "runbox-agent: copy skeleton:", err)
		}
	}
	var when *regexp.Regexp
	if *preloadWhen != "" {
		if when, err = regexp.Compile(*preloadWhen); err != nil {
			fmt.Fprintln(os.Stderr, "runbox-agent: -preload-when:", err)
			os.Exit(2)
		}
	}
	wipe := []string{"/tmp", "/dev/shm", "/dev/mqueue"}
	if *execDir != "" {
		wipe = append(wipe, *execDir)
	}
	cfg := agent.Config{
		Launch:      flag.Args(),
		Ext:         *ext,
		Dir:         *dir,
		Scratch:     *scratch,
		Sweep:       *sweep,
		Env:         programEnv(os.Environ()),
		OOMKills:    agent.CgroupOOMKills,
		Zygote:      strings.Fields(*zygote),
		Preload:     *preload,
		PreloadWhen: when,
		Skel:        *skel,
		Wipe:        wipe,
		Proxy:       *proxy,
		ProxySocket: *proxySocket,
		User:        user,
		Compile:     strings.Fields(*compile),
		ExecDir:     *execDir,
		Prestart:    *prestart,
		Prelude:     *prelude,
	}
	// One thread runs the agent's goroutines: each step of a run hands
	// over from one goroutine to another (a frame read, the program's
	// start, its output, its exit), and a goroutine woken on another
	// thread waits for that thread's wake-up, ~1 ms under gVisor; on one
	// it runs as soon as the current one parks. Every descriptor the
	// agent waits on is served by the runtime's poller (pollable below),
	// so no system call holds the thread for long; the agent's work is
	// small beside a program's.
	runtime.GOMAXPROCS(1)
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	if os.Getpid() == 1 {
		// As the container's init, the agent gets only the signals it
		// handles from processes of its container; catching these and
		// dropping them, no program can end it. (Caught, not ignored: an
		// ignored signal stays ignored in every program the agent
		// starts, which could then not be asked to stop, nor trap it.)
		// The executor ends it by closing its input or by killing the
		// container.
		dropped := make(chan os.Signal, 16)
		signal.Notify(dropped, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP, syscall.SIGQUIT, syscall.SIGUSR1,
			syscall.SIGUSR2, syscall.SIGALRM, syscall.SIGVTALRM, syscall.SIGPROF, syscall.SIGTSTP, syscall.SIGTTIN,
			syscall.SIGTTOU, syscall.SIGXCPU, syscall.SIGXFSZ, syscall.SIGPWR)
		go func() {
			for range dropped {
			}
		}()
	} else {
		ctx, stop = signal.NotifyContext(ctx, syscall.SIGTERM, os.Interrupt)
		defer stop()
	}
	if err := agent.Serve(ctx, cfg, pollable(os.Stdin), pollable(os.Stdout)); err != nil && ctx.Err() == nil {
		fmt.Fprintln(os.Stderr, "runbox-agent:", err)
		os.Exit(1)
	}
}

// programUser reads RUNBOX_USER, uid:gid: the user programs run as when it
// is not the agent's (agent.Config.User); nil when unset.
func programUser(v string) (*syscall.Credential, error) {
	if v == "" {
		return nil, nil
	}
	u, g, ok := strings.Cut(v, ":")
	uid, uerr := strconv.ParseUint(u, 10, 32)
	gid, gerr := strconv.ParseUint(g, 10, 32)
	if !ok || uerr != nil || gerr != nil || uid == 0 {
		return nil, fmt.Errorf("want uid:gid of a user other than root, got %q", v)
	}
	return &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)}, nil
}

// programEnv is the agent's environment without its own settings.
func programEnv(env []string) []string {
	out := env[:0:0]
	for _, kv := range env {
		if !strings.HasPrefix(kv, "RUNBOX_") {
			out = append(out, kv)
		}
	}
	return out
}

// pollable returns f (stdin or stdout: the executor's frames) as a file the
// runtime's poller serves, if its descriptor can be made non-blocking: a
// goroutine reading it then parks, and the one a frame wakes runs on the
// same thread, where a read blocked in the kernel kept its thread (and the
// woken goroutine waited for another: 1 to 2 ms a frame under gVisor). The
// descriptor is f's; nothing else of the agent uses f.
func pollable(f *os.File) *os.File {
	fd := int(f.Fd())
	if err := syscall.SetNonblock(fd, true); err != nil {
		return f
	}
	return os.NewFile(uintptr(fd), f.Name())
}
