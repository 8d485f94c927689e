package agent

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// TestCompiledRuns: a compiled language's run is its compiler, then its
// program; a failed build ends the run with the compiler's exit and
// messages (phase compile), and a program sent again runs from the cache,
// with the compiler's warnings replayed.
func TestCompiledRuns(t *testing.T) {
	builds := filepath.Join(t.TempDir(), "builds")
	// The "compiler" copies the source, warns, counts its builds, fails on
	// BAD and hangs on SLOW.
	compiler := `cp {src} {out}/prog.sh; echo "warning: $(head -c 9 {src})" >&2; echo b >> ` + builds + `
grep -q BAD {src} && { echo "{src}:1: error: BAD" >&2; exit 3; }
grep -q SLOW {src} && sleep 60
exit 0`
	c := serveAgent(t, Config{
		Launch:  []string{"bash", "{out}/prog.sh"},
		Compile: []string{"sh", "-c", compiler},
		ExecDir: t.TempDir(),
		Ext:     "sh",
		Dir:     t.TempDir(),
		Scratch: t.TempDir(),
		Env:     []string{"PATH=" + os.Getenv("PATH")},
	}, nil)
	tests := []struct {
		name      string
		run       Run
		stdin     string
		kill      bool
		wantOut   string
		wantErr   string
		wantCode  int
		wantPhase string
		wantBuilt int
	}{
		{name: "built and run", run: Run{Code: "read x; echo hi $x"}, stdin: "you\n", wantOut: "hi you\n",
			wantErr: "warning: read x; e\n", wantPhase: PhaseRun, wantBuilt: 1},
		{name: "the same program runs from the cache, its warnings replayed", run: Run{Code: "read x; echo hi $x"}, stdin: "again\n",
			wantOut: "hi again\n", wantErr: "warning: read x; e\n", wantPhase: PhaseRun, wantBuilt: 1},
		{name: "another environment builds again", run: Run{Code: "read x; echo hi $x", Env: map[string]string{"CFLAGS": "-g"}},
			wantOut: "hi\n", wantErr: "warning: read x; e\n", wantPhase: PhaseRun, wantBuilt: 2},
		{name: "a build error is the run's end", run: Run{Code: "echo BAD"}, wantErr: "warning: echo BAD\nmain.sh:1: error: BAD\n",
			wantCode: 3, wantPhase: PhaseCompile, wantBuilt: 3},
		{name: "a failed build is not cached", run: Run{Code: "echo BAD"}, wantErr: "warning: echo BAD\nmain.sh:1: error: BAD\n",
			wantCode: 3, wantPhase: PhaseCompile, wantBuilt: 4},
		{name: "a runtime error is the program's", run: Run{Code: "echo out; exit 5"}, wantOut: "out\n", wantErr: "warning: echo out;\n",
			wantCode: 5, wantPhase: PhaseRun, wantBuilt: 5},
		{name: "a kill stops the compiler", run: Run{Code: "echo SLOW"}, kill: true, wantErr: "", wantCode: -1,
			wantPhase: PhaseCompile, wantBuilt: 6},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			send(t, c, tt.run, tt.stdin)
			if tt.kill {
				waitUntil(t, func() bool { return count(builds) == tt.wantBuilt })
				time.Sleep(100 * time.Millisecond)
				if err := c.Kill(); err != nil {
					t.Fatal(err)
				}
			}
			o := collect(t, c)
			if o.failed != "" {
				t.Fatalf("run failed to start: %s", o.failed)
			}
			if o.stdout != tt.wantOut || (!tt.kill && o.stderr != tt.wantErr) {
				t.Errorf("stdout %q stderr %q, want %q %q", o.stdout, o.stderr, tt.wantOut, tt.wantErr)
			}
			if o.exit.ExitCode != tt.wantCode || o.exit.Phase != tt.wantPhase {
				t.Errorf("exit %+v, want code %d phase %s", o.exit, tt.wantCode, tt.wantPhase)
			}
			if n := count(builds); n != tt.wantBuilt {
				t.Errorf("%d builds, want %d", n, tt.wantBuilt)
			}
		})
	}
}

func count(file string) int {
	b, _ := os.ReadFile(file)
	return strings.Count(string(b), "\n")
}

func waitUntil(t *testing.T, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatal("timed out waiting")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestPrune: the build cache drops its least recently used entries, and
// any a build left half made, to stay within its budget.
func TestPrune(t *testing.T) {
	cache := t.TempDir()
	now := time.Now()
	for i, name := range []string{"old", "mid", "new", "x.tmp-1"} {
		dir := filepath.Join(cache, name)
		if err := os.Mkdir(dir, 0o700); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, "main"), make([]byte, 1000), 0o600); err != nil {
			t.Fatal(err)
		}
		at := now.Add(time.Duration(i) * time.Minute)
		if err := os.Chtimes(dir, at, at); err != nil {
			t.Fatal(err)
		}
	}
	prune(cache, 2000)
	entries, _ := os.ReadDir(cache)
	var left []string
	for _, e := range entries {
		left = append(left, e.Name())
	}
	if strings.Join(left, ",") != "mid,new" {
		t.Errorf("left %v, want mid and new", left)
	}
}

// TestPrestartedRuns: with Prestart, each run's process is started before
// the run and reads its source from /dev/fd/3; once a program matched
// PreloadWhen, the next ones find Preload run first. A run with an
// environment of its own starts the ordinary way.
func TestPrestartedRuns(t *testing.T) {
	starts := filepath.Join(t.TempDir(), "starts")
	dir := t.TempDir()
	c := serveAgent(t, Config{
		// It counts its starts, and says where it started.
		Launch:      []string{"sh", "-c", `echo s >> ` + starts + `; STARTED_IN=$PWD exec bash "$0"`, "{src}"},
		Prestart:    true,
		Prelude:     "cd " + dir,
		Preload:     "PRE=loaded",
		PreloadWhen: regexp.MustCompile(`want-preload`),
		Ext:         "sh",
		Dir:         dir,
		Scratch:     t.TempDir(),
		Env:         []string{"PATH=" + os.Getenv("PATH")},
	}, nil)
	waitUntil(t, func() bool { return count(starts) == 1 })
	tests := []struct {
		name, code, stdin string
		env               map[string]string
		wantOut           string
		wantCode          int
		wantStarts        int // processes started once the run is over
	}{
		{name: "pre-started", code: `read x; echo "$0 $x ${PRE:-none}" # want-preload`, stdin: "in\n",
			wantOut: "/dev/fd/3 in none\n", wantStarts: 2},
		{name: "preloaded next", code: `echo ${PRE:-none}; exit 4`, wantOut: "loaded\n", wantCode: 4, wantStarts: 3},
		{name: "started in /, runs in its folder", code: `echo $STARTED_IN; [ "$PWD" = "` + dir + `" ] && echo here`,
			wantOut: "/\nhere\n", wantStarts: 4},
		// The pre-started one is killed; this one and the next start.
		{name: "own environment", code: `echo $X`, env: map[string]string{"X": "x"}, wantOut: "x\n", wantStarts: 6},
		{name: "a long program", code: strings.Repeat("# padding\n", 20000) + "echo end", wantOut: "end\n", wantStarts: 7},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			send(t, c, Run{Code: tt.code, Env: tt.env}, tt.stdin)
			o := collect(t, c)
			if o.stdout != tt.wantOut || o.exit.ExitCode != tt.wantCode {
				t.Errorf("stdout %q stderr %q exit %+v, want %q %d", o.stdout, o.stderr, o.exit, tt.wantOut, tt.wantCode)
			}
			waitUntil(t, func() bool { return count(starts) >= tt.wantStarts })
			if n := count(starts); n != tt.wantStarts {
				t.Errorf("%d processes started, want %d", n, tt.wantStarts)
			}
		})
	}
}
