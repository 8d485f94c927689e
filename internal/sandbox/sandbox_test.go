package sandbox

import (
	"context"
	"crypto/rand"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/moby/moby/client"

	dockerengine "github.com/runbox-dev/runbox/internal/sandbox/docker"
	"github.com/runbox-dev/runbox/internal/sandbox/docker/dockertest"
	"github.com/runbox-dev/runbox/internal/sandbox/engine"
)

// engineOf returns the Docker engine of c, under its default runtime.
func engineOf(c *client.Client) Engine { return dockerengine.New(c, dockerengine.Options{}) }

func newManager(t testing.TB, limits Limits) (*Manager, *client.Client) {
	t.Helper()
	return newManagerOptions(t, func(o *Options) { o.Limits = limits })
}

// newManagerWith returns a Manager of the default limits, its options
// changed by change.
func newManagerWith(t testing.TB, change func(*Options)) *Manager {
	t.Helper()
	m, _ := newManagerOptions(t, func(o *Options) {
		o.Limits = defaultLimits
		change(o)
	})
	return m
}

func newManagerOptions(t testing.TB, change func(*Options)) (*Manager, *client.Client) {
	t.Helper()
	docker := dockertest.Client(t)
	opts := Options{ExecutorID: "test-" + rand.Text()[:8], MaxWarm: WarmLimits{Default: 8}, ImageTag: os.Getenv("RUNNER_TAG")}
	change(&opts)
	m := NewManager(engineOf(docker), opts)
	runners, err := m.Discover(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	if len(runners) < 3 {
		t.Fatalf("runners %v: run make images first", runners)
	}
	t.Cleanup(func() {
		m.Close()
		if n := m.Live(); n != 0 {
			t.Errorf("%d containers left tracked", n)
		}
		assertNoContainers(t, docker, m.opts.ExecutorID, "")
	})
	return m, docker
}

func assertNoContainers(t testing.TB, docker *client.Client, executor, deployment string) {
	t.Helper()
	if n := countContainers(t, docker, executor, deployment); n != 0 {
		t.Errorf("%d containers left behind", n)
	}
}

// countContainers counts the containers of executor (of deployment, if
// given).
func countContainers(t testing.TB, docker *client.Client, executor, deployment string) int {
	t.Helper()
	labels := []string{LabelExecutor + "=" + executor}
	if deployment != "" {
		labels = append(labels, LabelDeployment+"="+deployment)
	}
	res, err := docker.ContainerList(context.Background(), client.ContainerListOptions{
		All: true, Filters: client.Filters{}.Add("label", labels...),
	})
	if err != nil {
		t.Fatal(err)
	}
	return len(res.Items)
}

var defaultLimits = Limits{Memory: 256 << 20, NanoCPUs: 1e9, Pids: 128}

type capture struct {
	mu             sync.Mutex
	stdout, stderr strings.Builder
	chunks         []string    // stdout, as it came
	times          []time.Time // of the stdout chunks
}

func (c *capture) output(s Stream, p []byte) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if s == Stdout {
		c.stdout.Write(p)
		c.chunks = append(c.chunks, string(p))
		c.times = append(c.times, time.Now())
	} else {
		c.stderr.Write(p)
	}
}

func dataDir(t *testing.T) string {
	dir := t.TempDir()
	if err := os.Chmod(dir, 0o777); err != nil {
		t.Fatal(err)
	}
	return dir
}

func TestRunLanguages(t *testing.T) {
	m, _ := newManager(t, defaultLimits)
	tests := []struct {
		name, lang, code, stdin string
		wantOut, wantErr        string
		wantCode                int
	}{
		{"python", "python", "print(2+2)", "", "4\n", "", 0},
		{"python traceback", "python", "x = {}\nx['missing']", "", "", "KeyError: 'missing'", 1},
		{"python stdin", "python", "print(input()[::-1])", "olleh\n", "hello\n", "", 0},
		{"python exit code", "python", "import sys; sys.exit(7)", "", "", "", 7},
		{"typescript with types and imports", "typescript",
			"import { join } from 'node:path';\nconst n: number = 21;\nfunction twice(x: number): number { return x * 2 }\nconsole.log(join('a', 'b'), twice(n));",
			"", "a/b 42\n", "", 0},
		{"typescript syntax error", "typescript", "const x: = ;", "", "", "ERROR", 1},
		{"bash", "bash", "echo $((6*7)); pwd", "", "42\n/data\n", "", 0},
		{"non-root without capabilities", "bash", "id -u; grep CapEff /proc/self/status", "", "1000\nCapEff:\t0000000000000000\n", "", 0},
		{"no network", "python",
			"import socket\ntry:\n  socket.create_connection(('1.1.1.1', 53), timeout=2)\n  print('connected')\nexcept OSError as e:\n  print('blocked')",
			"", "blocked\n", "", 0},
		{"read-only root", "bash", "touch /usr/x 2>/dev/null || echo ro", "", "ro\n", "", 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var c capture
			req := Request{RunID: rand.Text()[:10], ConversationID: "c", Language: tt.lang, Code: tt.code,
				Timeout: 30 * time.Second, DataDir: dataDir(t)}
			if tt.stdin != "" {
				req.Stdin = strings.NewReader(tt.stdin)
			}
			oc, err := m.Run(context.Background(), req, c.output)
			if err != nil {
				t.Fatal(err)
			}
			if oc.ExitCode != tt.wantCode {
				t.Errorf("exit code %d, want %d (stderr %q)", oc.ExitCode, tt.wantCode, c.stderr.String())
			}
			if c.stdout.String() != tt.wantOut {
				t.Errorf("stdout %q, want %q", c.stdout.String(), tt.wantOut)
			}
			if !strings.Contains(c.stderr.String(), tt.wantErr) {
				t.Errorf("stderr %q, want it to contain %q", c.stderr.String(), tt.wantErr)
			}
		})
	}
}

// TestExecFolder: the sandbox of a compiled language (its image asks for
// an exec tmpfs) builds and runs programs from that folder, /tmp staying
// noexec, and says which phase ended a run; other sandboxes have no such
// folder.
func TestExecFolder(t *testing.T) {
	m, _ := newManager(t, defaultLimits)
	for lang, want := range map[string]bool{"c": true, "bash": false} {
		spec := m.spec(m.runners[lang], Request{})
		if ok := slices.ContainsFunc(spec.Tmpfs, func(t engine.Tmpfs) bool { return t.Target == ExecDir && t.Exec }); ok != want {
			t.Errorf("%s: exec tmpfs %v, want %v", lang, ok, want)
		}
	}
	dir := dataDir(t)
	tests := []struct {
		name, lang, code, wantOut, wantErr, wantPhase string
		wantCode                                      int
	}{
		{name: "runs from the exec folder, /tmp stays noexec", lang: "c",
			code:    "#include <stdio.h>\n#include <stdlib.h>\nint main(void) {\n    puts(\"hi\"); fflush(stdout);\n    if (system(\"cp /bin/true /tmp/t && /tmp/t 2>/dev/null\") != 0) puts(\"noexec\");\n}",
			wantOut: "hi\nnoexec\n", wantPhase: "run"},
		{name: "a compile error", lang: "c", code: "int main(void) { return x; }", wantErr: "undeclared", wantPhase: "compile", wantCode: 1},
		{name: "no exec folder elsewhere", lang: "bash", code: "touch /run/runbox/x 2>/dev/null || echo none", wantOut: "none\n"},
	}
	for _, tt := range tests {
		var c capture
		oc, err := m.Run(context.Background(), Request{RunID: rand.Text()[:10], ConversationID: "c", Language: tt.lang, Code: tt.code,
			Timeout: 60 * time.Second, DataDir: dir}, c.output)
		if err != nil {
			t.Fatal(err)
		}
		if oc.ExitCode != tt.wantCode || oc.Phase != tt.wantPhase || c.stdout.String() != tt.wantOut || !strings.Contains(c.stderr.String(), tt.wantErr) {
			t.Errorf("%s: %+v stdout %q stderr %q", tt.name, oc, c.stdout.String(), c.stderr.String())
		}
	}
}

func TestRunTimeoutKillsSandbox(t *testing.T) {
	m, _ := newManager(t, defaultLimits)
	start := time.Now()
	oc, err := m.Run(context.Background(), Request{RunID: rand.Text()[:10], ConversationID: "c", Language: "python",
		Code: "while True: pass", Timeout: 2 * time.Second, DataDir: dataDir(t)}, func(Stream, []byte) {})
	if err != nil {
		t.Fatal(err)
	}
	if !oc.TimedOut || oc.ExitCode != -1 {
		t.Errorf("outcome %+v, want timed out", oc)
	}
	// The program is stopped at its timeout; Run also starts the sandbox
	// (no pool here) and removes it.
	if oc.Duration > 3500*time.Millisecond || time.Since(start) > 20*time.Second {
		t.Errorf("a 2 s timeout: the program ran %v, Run took %v", oc.Duration, time.Since(start))
	}
	if n := m.Live(); n != 0 {
		t.Errorf("%d containers after a timeout: the killed sandbox must go", n)
	}
}

func TestRunCancel(t *testing.T) {
	m, _ := newManager(t, defaultLimits)
	ctx, cancel := context.WithCancel(context.Background())
	var c capture
	go func() {
		for {
			c.mu.Lock()
			up := strings.Contains(c.stdout.String(), "up")
			c.mu.Unlock()
			if up {
				cancel()
				return
			}
			time.Sleep(10 * time.Millisecond)
		}
	}()
	oc, err := m.Run(ctx, Request{RunID: rand.Text()[:10], ConversationID: "c", Language: "bash",
		Code: "echo up; sleep 60", Timeout: time.Minute, DataDir: dataDir(t)}, c.output)
	if err != nil {
		t.Fatal(err)
	}
	if !oc.Cancelled || oc.TimedOut {
		t.Errorf("outcome %+v, want cancelled", oc)
	}
}

func TestRunOOM(t *testing.T) {
	m, _ := newManager(t, Limits{Memory: 64 << 20, NanoCPUs: 1e9, Pids: 64})
	oc, err := m.Run(context.Background(), Request{RunID: rand.Text()[:10], ConversationID: "c", Language: "python",
		Code: "x = bytearray(512 << 20)\nprint('survived')", Timeout: 30 * time.Second, DataDir: dataDir(t)}, func(Stream, []byte) {})
	if err != nil {
		t.Fatal(err)
	}
	if !oc.OOMKilled || oc.ExitCode == 0 {
		t.Errorf("outcome %+v, want OOM killed", oc)
	}
}

func TestRunStreamsOutput(t *testing.T) {
	m, _ := newManager(t, defaultLimits)
	var c capture
	_, err := m.Run(context.Background(), Request{RunID: rand.Text()[:10], ConversationID: "c", Language: "python",
		Code: "import time\nprint('a')\ntime.sleep(2)\nprint('b')", Timeout: 30 * time.Second, DataDir: dataDir(t)}, c.output)
	if err != nil {
		t.Fatal(err)
	}
	if len(c.chunks) != 2 || c.chunks[0] != "a\n" {
		t.Fatalf("stdout came as %q (stderr %q), want two lines apart", c.chunks, c.stderr.String())
	}
	if gap := c.times[1].Sub(c.times[0]); gap < 1500*time.Millisecond {
		t.Errorf("chunks %v apart, want about 2s", gap)
	}
}

func TestRunWritesData(t *testing.T) {
	m, _ := newManager(t, defaultLimits)
	dir := dataDir(t)
	_, err := m.Run(context.Background(), Request{RunID: rand.Text()[:10], ConversationID: "c", Language: "python",
		Code: "import pandas as pd\npd.DataFrame({'a': [1, 2]}).to_csv('result.csv', index=False)", Timeout: 60 * time.Second, DataDir: dir},
		func(Stream, []byte) {})
	if err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(dir + "/result.csv")
	if err != nil || string(b) != "a\n1\n2\n" {
		t.Errorf("result.csv = %q, %v", b, err)
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 {
		t.Errorf("data folder holds %v, want only result.csv", entries)
	}
}

func TestReapRemovesOrphans(t *testing.T) {
	m, _ := newManager(t, defaultLimits)
	// A container of this executor that the manager does not track, as one
	// left by a crashed process would be.
	spec := m.spec(m.runners["bash"], Request{RunID: "orphan-" + rand.Text()[:8], ConversationID: "c", DataDir: dataDir(t)})
	att, err := m.engine.Create(context.Background(), spec, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	att.Closer.Close()
	n, err := m.Reap(context.Background(), 0)
	if err != nil {
		t.Fatal(err)
	}
	if n != 1 {
		t.Errorf("reaped %d, want 1", n)
	}
}

func TestReapDead(t *testing.T) {
	ctx := context.Background()
	deployment := "dep-" + rand.Text()[:8]
	docker := dockertest.Client(t)
	managers := map[string]*Manager{}
	for _, id := range []string{"live", "dead", "self"} {
		m := NewManager(engineOf(docker), Options{ExecutorID: "test-" + id + "-" + rand.Text()[:8], Deployment: deployment,
			ImageTag: os.Getenv("RUNNER_TAG")})
		if _, err := m.Discover(ctx); err != nil {
			t.Fatal(err)
		}
		managers[id] = m
	}
	other := NewManager(engineOf(docker), Options{ExecutorID: managers["dead"].opts.ExecutorID, Deployment: "other-" + rand.Text()[:8],
		ImageTag: os.Getenv("RUNNER_TAG")})
	if _, err := other.Discover(ctx); err != nil {
		t.Fatal(err)
	}
	// One container of each executor, as their pools would have made them;
	// "other" is the same executor id in another deployment that shares
	// the engine.
	for _, m := range []*Manager{managers["live"], managers["dead"], managers["self"], other} {
		att, err := m.engine.Create(ctx, m.spec(m.runners["bash"], Request{RunID: "pool", DataDir: dataDir(t)}), io.Discard)
		if err != nil {
			t.Fatal(err)
		}
		att.Closer.Close()
		t.Cleanup(func() { m.forceRemove(att.ID) })
	}
	self := managers["self"]
	alive := func(id string) bool { return id == managers["live"].opts.ExecutorID }
	peers, err := self.Peers(ctx)
	slices.Sort(peers)
	if want := []string{managers["dead"].opts.ExecutorID, managers["live"].opts.ExecutorID}; err != nil || !slices.Equal(peers, want) {
		t.Errorf("Peers = %v, %v; want %v", peers, err, want)
	}
	if n, err := self.ReapDead(ctx, alive, time.Hour); err != nil || len(n) != 0 {
		t.Fatalf("ReapDead of young containers = %v, %v; want none", n, err)
	}
	dead := managers["dead"].opts.ExecutorID
	if n, err := self.ReapDead(ctx, alive, 0); err != nil || len(n) != 1 || n[dead] != 1 {
		t.Fatalf("ReapDead = %v, %v; want one of %s", n, err, dead)
	}
	assertNoContainers(t, docker, managers["dead"].opts.ExecutorID, deployment)
	for _, m := range []*Manager{managers["live"], self, other} {
		if n := countContainers(t, docker, m.opts.ExecutorID, m.opts.Deployment); n != 1 {
			t.Errorf("executor %s of %s has %d containers, want 1", m.opts.ExecutorID, m.opts.Deployment, n)
		}
	}
}

// hostname runs a program that prints the sandbox's container id.
func hostname(t *testing.T, m *Manager, cid, lang, dir string) string {
	t.Helper()
	var c capture
	code := "cat /etc/hostname"
	if lang == "python" {
		code = "print(open('/etc/hostname').read().strip())"
	}
	if _, err := m.Run(context.Background(), Request{RunID: rand.Text()[:10], ConversationID: cid, Language: lang,
		Code: code, Timeout: 30 * time.Second, DataDir: dir}, c.output); err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(c.stdout.String())
}

func TestWarmSandboxes(t *testing.T) {
	m, _ := newManager(t, defaultLimits)
	dirA, dirB := dataDir(t), dataDir(t)
	a1 := hostname(t, m, "conv-a", "bash", dirA)
	a2 := hostname(t, m, "conv-a", "bash", dirA)
	b1 := hostname(t, m, "conv-b", "bash", dirB)
	if a1 != a2 {
		t.Errorf("a conversation's second run got a new sandbox (%s, %s)", a1, a2)
	}
	if b1 == a1 {
		t.Error("two conversations shared a sandbox")
	}
	if p := hostname(t, m, "conv-a", "python", dirA); p == a1 {
		t.Error("two languages shared a sandbox")
	}
	if m.Warm() != 3 {
		t.Errorf("%d warm sandboxes, want 3", m.Warm())
	}

	t.Run("nothing of a run outlives it", func(t *testing.T) {
		var c capture
		m.Run(context.Background(), Request{RunID: "r", ConversationID: "conv-a", Language: "bash",
			Code: "(setsid sleep 300 &); sleep 300 & echo started", Timeout: 30 * time.Second, DataDir: dirA}, c.output)
		c = capture{}
		m.Run(context.Background(), Request{RunID: "r", ConversationID: "conv-a", Language: "bash",
			Code: "ps -eo comm | grep -c sleep || true", Timeout: 30 * time.Second, DataDir: dirA}, c.output)
		if c.stdout.String() != "0\n" {
			t.Errorf("processes of the previous run survive: %q", c.stdout.String())
		}
	})

	t.Run("input never reaches the next program", func(t *testing.T) {
		pr, pw := io.Pipe()
		defer pw.Close()
		var c capture
		m.Run(context.Background(), Request{RunID: "r", ConversationID: "conv-a", Language: "bash",
			Code: "echo ignoring stdin", Stdin: pr, Timeout: 30 * time.Second, DataDir: dirA}, c.output)
		go pw.Write([]byte("stale input\n"))
		time.Sleep(100 * time.Millisecond)
		c = capture{}
		m.Run(context.Background(), Request{RunID: "r", ConversationID: "conv-a", Language: "bash",
			Code: "cat; echo end", Timeout: 30 * time.Second, DataDir: dirA}, c.output)
		if c.stdout.String() != "end\n" {
			t.Errorf("the next program read %q", c.stdout.String())
		}
	})

	t.Run("a folder made anew gets a new sandbox", func(t *testing.T) {
		os.RemoveAll(dirB)
		os.Mkdir(dirB, 0o777)
		os.Chmod(dirB, 0o777)
		if b2 := hostname(t, m, "conv-b", "bash", dirB); b2 == b1 {
			t.Error("the sandbox of a deleted folder was reused")
		}
	})

	t.Run("a sandbox whose container died is not used", func(t *testing.T) {
		before := hostname(t, m, "conv-b", "bash", dirB)
		if err := exec.Command("docker", "kill", before).Run(); err != nil {
			t.Fatal(err)
		}
		// The manager learns it when the container's attach stream ends.
		waitWarm(t, m, warmKey{"conv-b", "bash"}, "the killed sandbox was not seen to end",
			func(sb *sandbox) bool { return sb == nil || sb.ended() })
		if after := hostname(t, m, "conv-b", "bash", dirB); after == before || after == "" {
			t.Errorf("ran in %q after %q died", after, before)
		}
	})

	t.Run("a killed sandbox is replaced in the background", func(t *testing.T) {
		before := hostname(t, m, "conv-b", "bash", dirB)
		oc, err := m.Run(context.Background(), Request{RunID: "r", ConversationID: "conv-b", Language: "bash",
			Code: "sleep 30", Timeout: time.Second, DataDir: dirB}, func(Stream, []byte) {})
		if err != nil || !oc.TimedOut {
			t.Fatalf("%+v %v", oc, err)
		}
		waitWarm(t, m, warmKey{"conv-b", "bash"}, "no sandbox was started in place of the killed one",
			func(sb *sandbox) bool { return sb != nil })
		if after := hostname(t, m, "conv-b", "bash", dirB); after == before {
			t.Error("the killed sandbox was used again")
		}
	})

	t.Run("drop and prune", func(t *testing.T) {
		if n := m.Drop("conv-a"); n != 2 {
			t.Errorf("dropped %d, want 2", n)
		}
		m.opts.IdleTTL = time.Nanosecond
		if n := m.Prune(); n != 1 {
			t.Errorf("pruned %d, want 1", n)
		}
		if m.Warm() != 0 || m.Live() != 0 {
			t.Errorf("%d warm, %d live", m.Warm(), m.Live())
		}
	})
}

// TestZygoteInSandbox: once its zygote is ready, a Python sandbox forks
// programs with the data stack already imported.
func TestZygoteInSandbox(t *testing.T) {
	m, _ := newManager(t, defaultLimits)
	dir := dataDir(t)
	deadline := time.Now().Add(60 * time.Second)
	for {
		var c capture
		_, err := m.Run(context.Background(), Request{RunID: "z", ConversationID: "zyg", Language: "python",
			Code: "import sys\nprint('pandas' in sys.modules, __name__)", Timeout: 30 * time.Second, DataDir: dir}, c.output)
		if err != nil {
			t.Fatal(err)
		}
		if c.stdout.String() == "True __main__\n" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("programs never ran with pandas preloaded: %q %q", c.stdout.String(), c.stderr.String())
		}
		time.Sleep(200 * time.Millisecond)
	}
	var c capture
	start := time.Now()
	oc, err := m.Run(context.Background(), Request{RunID: "z", ConversationID: "zyg", Language: "python",
		Code:    "import pandas as pd, matplotlib.pyplot as plt\npd.DataFrame({'x': [1, 2, 3]}).plot()\nplt.savefig('p.png')\nprint('ok')",
		Timeout: 30 * time.Second, DataDir: dir}, c.output)
	if err != nil || oc.ExitCode != 0 || c.stdout.String() != "ok\n" {
		t.Fatalf("%+v %v %q %q", oc, err, c.stdout.String(), c.stderr.String())
	}
	t.Logf("pandas + matplotlib snippet from the zygote: %v", time.Since(start))
	if _, err := os.Stat(dir + "/p.png"); err != nil {
		t.Error(err)
	}
	// A memory hog is killed, not the zygote: the next run still forks.
	oc, _ = m.Run(context.Background(), Request{RunID: "z", ConversationID: "zyg", Language: "python",
		Code: "x = bytearray(1 << 30)", Timeout: 30 * time.Second, DataDir: dir}, func(Stream, []byte) {})
	if !oc.OOMKilled {
		t.Errorf("hog outcome %+v", oc)
	}
	c = capture{}
	m.Run(context.Background(), Request{RunID: "z", ConversationID: "zyg", Language: "python",
		Code: "import sys\nprint('pandas' in sys.modules)", Timeout: 30 * time.Second, DataDir: dir}, c.output)
	if c.stdout.String() != "True\n" {
		t.Errorf("after the hog: %q", c.stdout.String())
	}
}

func TestParseWarmLimits(t *testing.T) {
	tests := []struct {
		in                 string
		python, bash, rust int
		bad                bool
	}{
		{in: "16", python: 16, bash: 16, rust: 16},
		{in: "python=8,bash=2", python: 8, bash: 2},
		{in: "4, python=12", python: 12, bash: 4, rust: 4},
		{in: "0", python: 0},
		{in: "python=-1", bad: true},
		{in: "lots", bad: true},
	}
	for _, tt := range tests {
		l, err := ParseWarmLimits(tt.in)
		if (err != nil) != tt.bad {
			t.Errorf("%q: error %v", tt.in, err)
			continue
		}
		if !tt.bad && (l.For("python") != tt.python || l.For("bash") != tt.bash || l.For("rust") != tt.rust) {
			t.Errorf("%q: python %d bash %d rust %d", tt.in, l.For("python"), l.For("bash"), l.For("rust"))
		}
	}
}

func TestWarmLimitPerLanguage(t *testing.T) {
	m, _ := newManager(t, defaultLimits)
	m.opts.MaxWarm = WarmLimits{PerLanguage: map[string]int{"bash": 2}}
	var first string
	for i := range 3 {
		h := hostname(t, m, fmt.Sprintf("lim-%d", i), "bash", dataDir(t))
		if i == 0 {
			first = h
		}
	}
	hostname(t, m, "lim-py", "python", dataDir(t))
	time.Sleep(200 * time.Millisecond)
	if n := m.Warm(); n != 2 {
		t.Errorf("%d warm sandboxes, want the 2 bash ones (python gets none)", n)
	}
	m.mu.Lock()
	_, kept := m.warm[warmKey{"lim-0", "bash"}]
	m.mu.Unlock()
	if kept {
		t.Errorf("the least recently used sandbox %s was kept", first)
	}
}

// TestPool: a pre-started sandbox becomes a new conversation's when its
// slot folder is renamed to the conversation's; every new conversation's
// ask counts towards the pool's size.
func TestPool(t *testing.T) {
	m := newManagerWith(t, func(o *Options) { o.MaxPool = WarmLimits{Default: 16} })
	base := t.TempDir()
	slot := filepath.Join(base, "slot")
	os.Mkdir(slot, 0o777)
	os.Chmod(slot, 0o777)
	if err := m.Prestart(context.Background(), "bash", slot); err != nil {
		t.Fatal(err)
	}
	if m.Pooled("bash") != 1 || m.Pooled("python") != 0 {
		t.Fatalf("pooled %d bash, %d python", m.Pooled("bash"), m.Pooled("python"))
	}
	pooled := m.policy.pool["bash"][0].id[:12]
	conv := filepath.Join(base, "conv")
	adopted := m.Adopt(context.Background(), "conv-x", "bash", func(s string) (string, error) {
		if s != slot {
			t.Errorf("slot %s, want %s", s, slot)
		}
		return conv, os.Rename(s, conv)
	})
	if !adopted || m.Pooled("bash") != 0 {
		t.Fatalf("adopted %v, %d left", adopted, m.Pooled("bash"))
	}
	var c capture
	if _, err := m.Run(context.Background(), Request{RunID: "p", ConversationID: "conv-x", Language: "bash",
		Code: "echo hi > hi.txt; cat /etc/hostname", Timeout: 30 * time.Second, DataDir: conv}, c.output); err != nil {
		t.Fatal(err)
	}
	if host := strings.TrimSpace(c.stdout.String()); host != pooled {
		t.Errorf("ran in %s, not in the pre-started %s", host, pooled)
	}
	if b, _ := os.ReadFile(filepath.Join(conv, "hi.txt")); string(b) != "hi\n" {
		t.Errorf("the program wrote %q into the conversation's folder", b)
	}
	if m.Adopt(context.Background(), "conv-y", "bash", func(string) (string, error) { return "", nil }) {
		t.Error("adopted from an empty pool")
	}
	// Both new conversations asked: the pool should hold two now.
	if got := m.PoolTarget("bash", 1); got != 2 {
		t.Errorf("pool target after two asks: %d", got)
	}
}

// TestSeveralSandboxesPerConversation: runs of one conversation that go
// at once get a sandbox each, all mounting the conversation's folder;
// afterwards one stays warm and the others are removed, never recycled:
// their folder is the conversation's. While a run holds the conversation,
// its idle sandboxes are not recycled either.
func TestSeveralSandboxesPerConversation(t *testing.T) {
	docker := dockertest.Client(t)
	var mu sync.Mutex
	var asked []bool // what mounted said for each recycling asked for
	m := NewManager(engineOf(docker), Options{ExecutorID: "test-" + rand.Text()[:8], Limits: defaultLimits,
		MaxWarm: WarmLimits{Default: 8}, MaxPool: WarmLimits{Default: 8}, ImageTag: os.Getenv("RUNNER_TAG"),
		Recycle: func(_ string, mounted func(string) bool, _ time.Time) (string, error) {
			mu.Lock()
			defer mu.Unlock()
			asked = append(asked, mounted(""))
			return "", fmt.Errorf("not recycled in this test")
		}})
	if _, err := m.Discover(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		m.Close()
		assertNoContainers(t, docker, m.opts.ExecutorID, "")
	})
	dir := dataDir(t)

	// Two runs at once: each waits until the other's file is there.
	var wg sync.WaitGroup
	hosts := make([]string, 2)
	for i := range 2 {
		wg.Go(func() {
			release := m.Hold("conv")
			defer release()
			var c capture
			code := fmt.Sprintf("touch mine-%d; for i in $(seq 100); do [ -e mine-%d ] && break; sleep 0.1; done; ls mine-%d >/dev/null && cat /etc/hostname",
				i, 1-i, 1-i)
			oc, err := m.Run(context.Background(), Request{RunID: fmt.Sprint("r", i), ConversationID: "conv", Language: "bash",
				Code: code, Timeout: 30 * time.Second, DataDir: dir}, c.output)
			if err != nil || oc.ExitCode != 0 {
				t.Errorf("run %d: %+v %v (stderr %q)", i, oc, err, c.stderr.String())
			}
			hosts[i] = strings.TrimSpace(c.stdout.String())
		})
	}
	wg.Wait()
	if hosts[0] == hosts[1] || hosts[0] == "" {
		t.Errorf("the two runs ran in %q and %q", hosts[0], hosts[1])
	}
	deadline := time.Now().Add(10 * time.Second)
	for m.Live() != 1 && time.Now().Before(deadline) {
		time.Sleep(20 * time.Millisecond)
	}
	if m.Warm() != 1 || m.Live() != 1 {
		t.Errorf("%d warm, %d live; want the surplus sandbox removed", m.Warm(), m.Live())
	}
	mu.Lock()
	if len(asked) != 0 {
		t.Errorf("the surplus sandbox was recycled: %v", asked)
	}
	mu.Unlock()

	// A run holds the conversation: its idle sandbox is not recycled.
	release := m.Hold("conv")
	if !m.HasSandbox("conv") {
		t.Error("a held conversation has no sandbox")
	}
	m.opts.IdleTTL = time.Nanosecond
	if n := m.Prune(); n != 1 {
		t.Fatalf("pruned %d", n)
	}
	release()
	m.Prune()
	deadline = time.Now().Add(30 * time.Second)
	for {
		mu.Lock()
		n := len(asked)
		mu.Unlock()
		if n >= 1 || time.Now().After(deadline) {
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	mu.Lock()
	if len(asked) != 1 || asked[0] {
		t.Errorf("recycling of a held conversation's sandbox was asked %v; want once, refused", asked)
	}
	mu.Unlock()
	if m.HasSandbox("conv") {
		t.Error("a released conversation without sandboxes has one")
	}
}

// TestCloseWaitsForBackgroundWork: Close returns only once the sandboxes
// being removed in the background (the surplus of a conversation whose
// runs went at once) are gone, and a run that ends after Close keeps no
// sandbox.
func TestCloseWaitsForBackgroundWork(t *testing.T) {
	docker := dockertest.Client(t)
	m := NewManager(engineOf(docker), Options{ExecutorID: "test-" + rand.Text()[:8], Limits: defaultLimits,
		MaxWarm: WarmLimits{Default: 8}, ImageTag: os.Getenv("RUNNER_TAG")})
	if _, err := m.Discover(context.Background()); err != nil {
		t.Fatal(err)
	}
	dir := dataDir(t)
	run := func(id string) {
		var c capture
		if _, err := m.Run(context.Background(), Request{RunID: id, ConversationID: "conv", Language: "bash",
			Code: "sleep 0.5", Timeout: 30 * time.Second, DataDir: dir}, c.output); err != nil {
			t.Errorf("run %s: %v", id, err)
		}
	}
	var wg sync.WaitGroup
	for i := range 4 {
		wg.Go(func() { run(fmt.Sprint("r", i)) })
	}
	wg.Wait()
	m.Close()
	if n := m.Live(); n != 0 {
		t.Errorf("%d containers tracked after Close", n)
	}
	assertNoContainers(t, docker, m.opts.ExecutorID, "")

	run("after")
	if m.Warm() != 0 || m.Live() != 0 {
		t.Errorf("after Close a run left %d warm, %d live", m.Warm(), m.Live())
	}
	assertNoContainers(t, docker, m.opts.ExecutorID, "")
}

// waitWarm waits up to 20 s for the warm sandbox kept under key (nil if
// none) to satisfy cond, and fails with msg if it does not.
func waitWarm(t *testing.T, m *Manager, key warmKey, msg string, cond func(*sandbox) bool) {
	t.Helper()
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		m.mu.Lock()
		sb := m.warm[key]
		m.mu.Unlock()
		if cond(sb) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal(msg)
		}
	}
}
