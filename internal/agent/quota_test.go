package agent

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestQuotaStopsRuns: an agent given a quota stops a program whose files
// pass it as it runs, says which bound in its exit, and leaves the sum
// out; growth is what counts, and a folder it cannot walk has passed.
func TestQuotaStopsRuns(t *testing.T) {
	tests := []struct {
		name string
		// before fills the folder ahead of the run.
		before    string
		code      string
		wantQuota string
		// killed: the agent stopped the program (it would not end).
		killed bool
	}{
		{name: "files without end", code: `i=0; while :; do : > f$((i++)); done`, wantQuota: QuotaEntries, killed: true},
		{name: "files in folders without end", code: `i=0; while :; do mkdir d$i; : > d$i/f; i=$((i+1)); done`, wantQuota: QuotaEntries, killed: true},
		{name: "bytes without end", code: `i=0; while :; do head -c 65536 /dev/zero > f$i; i=$((i+1)); done`, wantQuota: QuotaBytes, killed: true},
		// Past the bound and done before the first measure: found at
		// the exit.
		{name: "files at once", code: `touch $(seq 1 600)`, wantQuota: QuotaEntries},
		{name: "a sparse file past the bytes", code: `truncate -s 8M sparse`, wantQuota: QuotaBytes},
		// A path too long for the walk to name (a folder it may not
		// read, to an agent that is not root, is the same).
		{name: "hidden from the walk", code: `n=$(printf 'a%.0s' {1..250}); for i in $(seq 18); do mkdir $n; cd $n; done; touch f`, wantQuota: QuotaEntries},
		{name: "within both", code: `touch $(seq 1 100); head -c 100000 /dev/zero > b`},
		// Already past (the bound was lowered): a run that deletes, or
		// adds nothing, goes on.
		{name: "past already, deletes", before: `touch $(seq 1 600)`, code: `rm $(seq 1 10)`},
		{name: "past already, adds", before: `touch $(seq 1 600)`, code: `touch more`, wantQuota: QuotaEntries},
		{name: "past twice already, deletes", before: `touch $(seq 1 1200)`, code: `rm 1`, wantQuota: QuotaEntries},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			t.Cleanup(func() { exec.Command("chmod", "-R", "u+rwx", dir).Run() })
			if tt.before != "" {
				cmd := exec.Command("bash", "-c", tt.before)
				cmd.Dir = dir
				if out, err := cmd.CombinedOutput(); err != nil {
					t.Fatalf("%v: %s", err, out)
				}
			}
			c := startAgentConfig(t, func(cfg *Config) {
				cfg.Dir, cfg.DataSum = dir, true
				cfg.Quota = Quota{Bytes: 4 << 20, Entries: 500}
			}, nil)
			start := time.Now()
			send(t, c, Run{Code: tt.code}, "")
			o := collect(t, c)
			if o.exit.Quota != tt.wantQuota {
				t.Fatalf("exit %+v (stderr %q): quota %q, want %q", o.exit, o.stderr, o.exit.Quota, tt.wantQuota)
			}
			if tt.killed && (o.exit.Signal != 9 || time.Since(start) > 10*time.Second) {
				t.Errorf("exit %+v after %v: want the program killed at once", o.exit, time.Since(start))
			}
			if (o.exit.DataSum == "") != (tt.wantQuota != "") {
				t.Errorf("data sum %q with quota %q: want one or the other", o.exit.DataSum, o.exit.Quota)
			}
		})
	}
}

// TestQuotaMeasure: what an entry counts for, as walk mode counts it (4
// KiB at least), or as a copy would write it (a sparse file's apparent
// size); a walk stops past the entries' bound.
func TestQuotaMeasure(t *testing.T) {
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "empty"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "small"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	f, err := os.Create(filepath.Join(dir, "sparse"))
	if err != nil {
		t.Fatal(err)
	}
	if err := f.Truncate(10 << 20); err != nil {
		t.Fatal(err)
	}
	f.Close()
	if err := os.Symlink("/nowhere", filepath.Join(dir, "link")); err != nil {
		t.Fatal(err)
	}
	// The folder (4 KiB), three files and a link of less than 4 KiB
	// each, a sparse file of 10 MiB.
	if u := measure(dir, 0); !u.whole || u.entries != 5 || u.bytes != 4*4096+10<<20 {
		t.Errorf("measure: %+v; want 5 entries, %d bytes", u, 4*4096+10<<20)
	}
	if u := measure(dir, 2); u.entries != 3 {
		t.Errorf("measure bounded to 2 entries: %+v; want 3 counted", u)
	}
	if u := measure(filepath.Join(dir, "missing"), 0); !u.whole || u.entries != 0 {
		t.Errorf("measure of a missing folder: %+v", u)
	}
}

// TestLimitFileSize: a process that bounds its file size (this test's
// binary started again, then the shell it becomes) cannot write a file
// past the bound, and its hard limit is the bound: no process without
// CAP_SYS_RESOURCE may raise it.
func TestLimitFileSize(t *testing.T) {
	if dir := os.Getenv("LIMIT_FILE_SIZE_DIR"); dir != "" {
		if err := LimitFileSize(1 << 20); err != nil {
			t.Fatal(err)
		}
		// A higher bound keeps the lower one.
		if err := LimitFileSize(2 << 20); err != nil {
			t.Fatal(err)
		}
		script := `head -c 2M /dev/zero > "$1/big"; echo "head $?"; echo "hard $(ulimit -H -f)"`
		err := syscall.Exec("/bin/bash", []string{"bash", "-c", script, "bash", dir}, os.Environ())
		t.Fatal(err)
	}
	dir := t.TempDir()
	cmd := exec.Command(os.Args[0], "-test.run=^TestLimitFileSize$", "-test.v=false")
	cmd.Env = append(os.Environ(), "LIMIT_FILE_SIZE_DIR="+dir)
	out, err := cmd.Output() // bash says on stderr that head was killed
	if err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	// SIGXFSZ (25) ended head; bash counts blocks of 1 KiB.
	want := "head " + strconv.Itoa(128+25) + "\nhard 1024\n"
	if string(out) != want {
		t.Errorf("output %q, want %q", out, want)
	}
	if info, err := os.Stat(filepath.Join(dir, "big")); err != nil || info.Size() != 1<<20 {
		t.Errorf("the file written past the bound: %v, %v; want 1 MiB", info, err)
	}
	for _, bad := range []int64{0, -1} {
		if err := LimitFileSize(bad); err == nil || !strings.Contains(err.Error(), "bound") {
			t.Errorf("LimitFileSize(%d): %v", bad, err)
		}
	}
}
