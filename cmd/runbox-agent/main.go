// Command runbox-agent runs inside a sandbox container. It reads programs
// from its stdin in the runner protocol (package agent), runs them one at a
// time, and reports their output and exit on its stdout.
//
// Usage: runbox-agent -ext=py [-sweep] [-skel=DIR] [-zygote=CMD | -prestart | -compile=CMD -exec-dir=DIR] -- LAUNCH...
//
// RUNBOX_USER=uid:gid in its environment starts programs, the zygote and
// its template as that user instead of the agent's own (the executor sets
// it, and starts the agent as root with a few capabilities, under gVisor:
// see agent.Config.User). RUNBOX_AWAIT_INPUT=1 has it read one byte of
// input before its hello (the Kubernetes engine's executor attaches to a
// running container, then sends it); RUNBOX_DATA_SUM=1 has each run's
// exit carry a fingerprint of /data (agent.Config.DataSum).
// RUNBOX_FILE_SIZE=BYTES bounds every file the agent and its programs
// write (agent.LimitFileSize), and RUNBOX_QUOTA_BYTES and
// RUNBOX_QUOTA_FILES bound what programs leave in /data as they run
// (agent.Config.Quota): the Kubernetes engine sets them, where no ulimit
// of the container's and no executor's measure does.
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
	opts := parseFlags()
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
	limits, err := readLimits(os.Getenv)
	if err != nil {
		fmt.Fprintln(os.Stderr, "runbox-agent:", err)
		os.Exit(2)
	}
	// Before any child, and before the agent writes a file.
	if limits.fileSize > 0 {
		if err := agent.LimitFileSize(limits.fileSize); err != nil {
			fmt.Fprintln(os.Stderr, "runbox-agent:", err)
			os.Exit(1)
		}
	}
	// Before any child: what the sandbox cannot list, nobody may make.
	if err := agent.DenyMqueuesUnlisted(); err != nil {
		fmt.Fprintln(os.Stderr, "runbox-agent: forbid POSIX message queues:", err)
		os.Exit(1)
	}
	if opts.skel != "" {
		if err := agent.CopyTree(opts.skel, "/tmp", user); err != nil {
			fmt.Fprintln(os.Stderr, "runbox-agent: copy skeleton:", err)
		}
	}
	cfg, err := opts.config(user)
	if err != nil {
		fmt.Fprintln(os.Stderr, "runbox-agent:", err)
		os.Exit(2)
	}
	cfg.Quota = limits.quota
	// One thread runs the agent's goroutines: each step of a run hands
	// over from one goroutine to another (a frame read, the program's
	// start, its output, its exit), and a goroutine woken on another
	// thread waits for that thread's wake-up, ~1 ms under gVisor; on one
	// it runs as soon as the current one parks. Every descriptor the
	// agent waits on is served by the runtime's poller (pollable below),
	// so no system call holds the thread for long; the agent's work is
	// small beside a program's.
	runtime.GOMAXPROCS(1)
	if os.Getenv("RUNBOX_AWAIT_INPUT") == "1" {
		awaitInput()
	}
	ctx, stop := serveContext()
	defer stop()
	if err := agent.Serve(ctx, cfg, pollable(os.Stdin), pollable(os.Stdout)); err != nil && ctx.Err() == nil {
		fmt.Fprintln(os.Stderr, "runbox-agent:", err)
		os.Exit(1)
	}
}

// options are the agent's flags.
type options struct {
	ext, dir, scratch, skel      string
	sweep                        bool
	zygote, preload, preloadWhen string
	proxy, proxySocket           string
	compile                      string
	prestart                     bool
	prelude, execDir             string
	launch                       []string
}

// parseFlags reads the flags; it exits with the usage when they do not
// make an agent.
func parseFlags() options {
	var o options
	flag.StringVar(&o.ext, "ext", "", "file extension of programs, without the dot")
	flag.StringVar(&o.dir, "dir", "/data", "working directory of programs")
	flag.StringVar(&o.scratch, "scratch", "/tmp/runbox", "folder the program file is written to")
	flag.BoolVar(&o.sweep, "sweep", false, "kill every other process of the sandbox after each run")
	flag.StringVar(&o.skel, "skel", "", "folder whose contents are copied into /tmp at start (caches)")
	flag.StringVar(&o.zygote, "zygote", "", "command of a zygote that forks programs, space-separated (e.g. python3 /opt/runbox/zygote.py)")
	flag.StringVar(&o.preload, "preload", "", "modules the zygote imports, comma-separated (or, with -prestart, code), once a program matches -preload-when")
	flag.StringVar(&o.preloadWhen, "preload-when", "", "regular expression over a program's source that triggers -preload")
	flag.StringVar(&o.proxy, "proxy", agent.ProxyAddr, "where programs reach the executor's egress proxy, on the sandbox's loopback; empty: nowhere")
	flag.StringVar(&o.proxySocket, "proxy-socket", agent.ProxySocket, "the executor's proxy socket, tried first for connections to the proxy listener; empty: none")
	flag.StringVar(&o.compile, "compile", "", "command that builds a program before it runs, space-separated: {src} is its file name, {out} the folder it writes, which LAUNCH names as {out}")
	flag.BoolVar(&o.prestart, "prestart", false, "start each run's process ahead, reading its source from /dev/fd/3 ({src} in LAUNCH); -preload is then code it runs first once a program matched -preload-when")
	flag.StringVar(&o.prelude, "prelude", "", "with -prestart: code the pre-started process runs first (it starts in /: e.g. a change to the programs' folder)")
	flag.StringVar(&o.execDir, "exec-dir", "", "folder programs may execute files from (a tmpfs without noexec), where compiled programs are cached; a reset wipes it")
	flag.Parse()
	o.launch = flag.Args()
	// A compiled language builds each program; a zygote forks it; a
	// pre-started process reads it: one way per image.
	ways := 0
	for _, set := range []bool{o.compile != "", o.zygote != "", o.prestart} {
		if set {
			ways++
		}
	}
	if o.ext == "" || len(o.launch) == 0 || (o.compile != "" && o.execDir == "") || ways > 1 {
		fmt.Fprintln(os.Stderr, "usage: runbox-agent -ext=EXT [-sweep] [-skel=DIR] [-zygote=CMD | -prestart | -compile=CMD -exec-dir=DIR] -- LAUNCH...")
		os.Exit(2)
	}
	return o
}

// config is the agent's configuration as the flags say, programs running
// as user (nil: the agent's own).
func (o options) config(user *syscall.Credential) (agent.Config, error) {
	var when *regexp.Regexp
	if o.preloadWhen != "" {
		var err error
		if when, err = regexp.Compile(o.preloadWhen); err != nil {
			return agent.Config{}, fmt.Errorf("-preload-when: %w", err)
		}
	}
	wipe := []string{"/tmp", "/dev/shm", "/dev/mqueue"}
	if o.execDir != "" {
		wipe = append(wipe, o.execDir)
	}
	return agent.Config{
		Launch:      o.launch,
		Ext:         o.ext,
		Dir:         o.dir,
		Scratch:     o.scratch,
		Sweep:       o.sweep,
		Env:         programEnv(os.Environ()),
		OOMKills:    agent.CgroupOOMKills,
		Zygote:      strings.Fields(o.zygote),
		Preload:     o.preload,
		PreloadWhen: when,
		Skel:        o.skel,
		Wipe:        wipe,
		Proxy:       o.proxy,
		ProxySocket: o.proxySocket,
		User:        user,
		Compile:     strings.Fields(o.compile),
		ExecDir:     o.execDir,
		Prestart:    o.prestart,
		Prelude:     o.prelude,
		DataSum:     os.Getenv("RUNBOX_DATA_SUM") == "1",
	}, nil
}

// serveContext is the context Serve runs under: as the container's init,
// one no signal ends; otherwise one SIGTERM or an interrupt cancels.
func serveContext() (context.Context, context.CancelFunc) {
	ctx, stop := context.WithCancel(context.Background())
	if os.Getpid() != 1 {
		sctx, sstop := signal.NotifyContext(ctx, syscall.SIGTERM, os.Interrupt)
		return sctx, func() { sstop(); stop() }
	}
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
	return ctx, stop
}

// awaitInput reads one byte of stdin, the executor's sign that it is
// there: a Kubernetes executor attaches to a container that already runs,
// and what the agent wrote before that (its hello) went to the
// container's log, never to the executor.
func awaitInput() {
	var b [1]byte
	if _, err := os.Stdin.Read(b[:]); err != nil {
		fmt.Fprintln(os.Stderr, "runbox-agent: await input:", err)
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

// limits are the bounds the environment sets: RUNBOX_FILE_SIZE,
// RUNBOX_QUOTA_BYTES and RUNBOX_QUOTA_FILES (unset: none).
type limits struct {
	fileSize int64
	quota    agent.Quota
}

// readLimits reads the bounds from getenv; a value that is not a whole
// number of at least 1 is an error.
func readLimits(getenv func(string) string) (limits, error) {
	var l limits
	var files int64
	for name, v := range map[string]*int64{"RUNBOX_FILE_SIZE": &l.fileSize, "RUNBOX_QUOTA_BYTES": &l.quota.Bytes, "RUNBOX_QUOTA_FILES": &files} {
		s := getenv(name)
		if s == "" {
			continue
		}
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil || n < 1 {
			return limits{}, fmt.Errorf("%s: want a number of at least 1, got %q", name, s)
		}
		*v = n
	}
	l.quota.Entries = int(files)
	return l, nil
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
