package e2e

import (
	"strings"
	"testing"
)

// TestRecycledSandbox: an idle sandbox evicted from its conversation is
// reset and serves a new conversation — and nothing of the first reaches
// the second: no file in /data, /tmp or /dev/shm, no process, no kept
// interpreter state, not its zygote (a new one is spawned from a template
// the first conversation's signals could not end). A sandbox that cannot
// be shown clean (a System V IPC object left, a resource limit or priority
// of the agent or the template changed) is removed instead. In walk mode the folder's entries move
// to the conversation; in loop mode (a disk image per conversation) they
// are copied to a new image.
func TestRecycledSandbox(t *testing.T) {
	for _, mode := range []string{"walk", "loop"} {
		t.Run(mode, func(t *testing.T) { testRecycledSandbox(t, mode) })
	}
}

func testRecycledSandbox(t *testing.T, mode string) {
	s := start(t, options{env: []string{"SANDBOX_MAX_WARM=1", "SANDBOX_POOL=0", "SANDBOX_QUOTA_MODE=" + mode}})
	cs := s.session(nil)
	py := func(cid, code string, keep bool) result {
		t.Helper()
		return runCode(t, cs, map[string]any{"language": "python", "conversationId": cid, "code": code, "keep_state": keep})
	}
	// The first conversation leaves what it can.
	first := runCode(t, cs, map[string]any{"language": "python", "conversationId": "first", "env": map[string]string{"FIRST_SECRET": "A"},
		"code": strings.Replace(`import os, subprocess, socket, ctypes, sys
open('/data/secret.txt', 'w').write('A')
open('/tmp/leak', 'w').write('A')
open('/dev/shm/leak', 'w').write('A')
os.makedirs('/tmp/locked/inner')
os.chmod('/tmp/locked', 0)
os.mkfifo('/tmp/fifo')
s = socket.socket(socket.AF_UNIX); s.bind('/tmp/sock')
site = os.path.expanduser('~/.local/lib/python%d.%d/site-packages' % sys.version_info[:2])
os.makedirs(site)
open(site + '/planted.py', 'w').write('LEAK = 1')
open(site + '/planted.pth', 'w').write('import planted')
open('/tmp/planted.py', 'w').write('LEAK = 1')
rt = ctypes.CDLL('librt.so.1', use_errno=True)
rt.mq_open.restype = ctypes.c_int
# Under gVisor, which has no mqueue file system to list queues by, the
# agent forbids them (EPERM).
assert rt.mq_open(b'/leak', os.O_CREAT | os.O_RDWR, 0o600, None) >= 0 or (GVISOR and ctypes.get_errno() == 1), ctypes.get_errno()
subprocess.Popen(['sleep', '300'], start_new_session=True)
# The zygote's template outlives the conversation: what a program can do to
# it (it runs as the same user) must not stop it serving the next one.
import signal
for p in os.listdir('/proc'):
    if p.isdigit() and int(p) not in (1, os.getpid(), os.getppid()):
        if b'zygote.py' in open(f'/proc/{p}/cmdline', 'rb').read():
            for sig in (signal.SIGSTOP, signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGRTMIN):
                os.kill(int(p), sig)
print(socket.gethostname())
print(os.getppid())`, "GVISOR", pyBool(underGVisor()), 1)})
	if first.ExitCode != 0 {
		t.Fatalf("first conversation: %+v", first)
	}
	hostA, zygoteA, _ := strings.Cut(strings.TrimSpace(first.Stdout), "\n")
	py("first", "secret = 'kept by the first'", true)
	// Another conversation's run evicts it (one warm sandbox at most).
	py("second", "print(1)", false)
	waitFor(t, func() bool { return s.recycled() == 1 })

	r := py("third", `import os, socket, sys
procs = sorted(open(f'/proc/{p}/cmdline', 'rb').read().split(b'\0')[0].decode() for p in os.listdir('/proc') if p.isdigit() and int(p) != os.getpid())
print(socket.gethostname())
print(sorted(os.listdir('/data')))
print(sorted(n for n in os.listdir('/tmp') if n not in ('runbox', 'matplotlib')))
print(sorted(os.listdir('/dev/shm')))
print(procs)
print('secret' in globals())
print(sorted(os.listdir('/dev/mqueue')) if os.path.isdir('/dev/mqueue') else [])
print('FIRST_SECRET' in os.environ, 'planted' in sys.modules)
try:
    import planted
    print('planted imported')
except ImportError:
    print('no planted module')`, true)
	lines := strings.Split(strings.TrimSpace(r.Stdout), "\n")
	if len(lines) != 9 {
		t.Fatalf("third conversation: %+v", r)
	}
	if lines[0] != hostA {
		t.Fatalf("the third conversation did not get the recycled sandbox (%s, not %s)", lines[0], hostA)
	}
	want := []string{"[]", "[]", "[]", "", "False", "[]", "False False", "no planted module"}
	for i, w := range want {
		if i == 3 {
			continue // processes, checked below
		}
		if lines[i+1] != w {
			t.Errorf("line %d: %s; want %s", i+1, lines[i+1], w)
		}
	}
	if strings.Contains(lines[4], "sleep") || strings.Count(lines[4], "'") > 6 {
		t.Errorf("processes in the recycled sandbox: %s", lines[4])
	}
	if r.StateLost {
		t.Error("a new conversation lost state it never had")
	}
	// Its programs fork from a zygote, not the first conversation's: one
	// spawned afresh from the template, which the signals did not end.
	zygoteCheck := `import os
def argv0(p):
    return open(f'/proc/{p}/cmdline', 'rb').read().split(b'\0')[0].decode() if p > 0 else ''
def zygote(p):
    return argv0(p) == 'python3' and b'zygote.py' in open(f'/proc/{p}/cmdline', 'rb').read()
z = os.getppid()
t = int(open(f'/proc/{z}/stat').read().rsplit(')', 1)[1].split()[1])
print(z, zygote(z), zygote(t))`
	var z result
	waitFor(t, func() bool {
		z = py("third", zygoteCheck, false)
		return !strings.Contains(z.Stdout, "False")
	})
	if zygote, spawned, _ := strings.Cut(strings.TrimSpace(z.Stdout), " "); zygote == zygoteA || spawned != "True True" {
		t.Errorf("the third conversation's zygote: %q (pid, from a zygote, spawned by a zygote); the first's was %s", z.Stdout, zygoteA)
	}
	// The first conversation still has its file, in a sandbox of its own,
	// and its kept variables: they were saved when its sandbox was recycled.
	if got := py("first", "print(open('/data/secret.txt').read(), 'secret' in globals())", true); got.Stdout != "A True\n" || got.StateLost || !got.StateRestored {
		t.Errorf("the first conversation afterwards: %+v", got)
	}

	// What a reset cannot undo makes a sandbox unfit for another
	// conversation: that sandbox is removed, not recycled (others may be,
	// meanwhile). What it can, it does.
	probes := []struct {
		name, code string
		fit        bool
	}{
		{name: "ipc", code: `import ctypes
libc = ctypes.CDLL(None)
assert libc.shmget(0, 4096, 0o1600) >= 0`},
		// The agent and the template outlive a conversation, and what
		// they start inherits these. (Under gVisor the agent runs as
		// another user, out of a program's reach: nothing changes.)
		{name: "agent-limit", fit: underGVisor(), code: `import resource
try:
    soft, hard = resource.prlimit(1, resource.RLIMIT_NOFILE)
    resource.prlimit(1, resource.RLIMIT_NOFILE, (soft - 1, hard))
except PermissionError:
    assert ` + pyBool(underGVisor()) + `, "the agent's limits were out of reach"`},
		{name: "template-priority", code: `import os
z = os.getppid()
t = int(open(f'/proc/{z}/stat').read().rsplit(')', 1)[1].split()[1])
assert b'zygote.py' in open(f'/proc/{t}/cmdline', 'rb').read(), 'no template'
os.setpriority(os.PRIO_PROCESS, t, 19)`},
		// A template a program killed is replaced by a new start, in a
		// reset that does not wait for the conversation's last program.
		{name: "template-killed", fit: true, code: `import os, signal
z = os.getppid()
t = int(open(f'/proc/{z}/stat').read().rsplit(')', 1)[1].split()[1])
assert b'zygote.py' in open(f'/proc/{t}/cmdline', 'rb').read(), 'no template'
os.kill(t, signal.SIGKILL)`},
	}
	for _, u := range probes {
		// Its programs fork from a zygote first (a sandbox just started
		// runs its first programs the ordinary way while the zygote starts).
		waitForZygote(t, cs, u.name)
		r := py(u.name, u.code+"\nimport socket\nprint(socket.gethostname())", false)
		host := strings.TrimSpace(r.Stdout)
		if r.ExitCode != 0 || host == "" {
			t.Fatalf("%s run: %+v", u.name, r)
		}
		// (It may itself be a recycled sandbox: only what comes after counts.)
		s.mu.Lock()
		seen := map[*proc]int{}
		for _, p := range s.procs {
			seen[p] = len(p.out.String())
		}
		s.mu.Unlock()
		recycled := func() bool {
			s.mu.Lock()
			defer s.mu.Unlock()
			for _, p := range s.procs {
				for line := range strings.SplitSeq(p.out.String()[seen[p]:], "\n") {
					if strings.Contains(line, "recycled a sandbox") && strings.Contains(line, "container="+host) {
						return true
					}
				}
			}
			return false
		}
		py("evicts-"+u.name, "print(1)", false)
		if u.fit {
			waitFor(t, recycled)
			continue
		}
		waitFor(t, func() bool { return !s.containerExists(host) })
		if recycled() {
			t.Errorf("%s: an unfit sandbox was recycled", u.name)
		}
	}
}

// recycled counts the sandboxes the service's executors recycled.
func (s *service) recycled() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := 0
	for _, p := range s.procs {
		n += strings.Count(p.out.String(), "recycled a sandbox")
	}
	return n
}
