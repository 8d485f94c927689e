package agent

import (
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// tree makes files (and their folders) under a new folder.
func tree(t *testing.T, files ...string) string {
	t.Helper()
	root := t.TempDir()
	for _, f := range files {
		p := filepath.Join(root, f)
		if strings.HasSuffix(f, "/") {
			if err := os.MkdirAll(p, 0o755); err != nil {
				t.Fatal(err)
			}
			continue
		}
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(f), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return root
}

func TestComplement(t *testing.T) {
	root := tree(t, "a/secret", "a/other", "a/deep/x", "b/file", "c/")
	if err := os.Symlink(filepath.Join(root, "a"), filepath.Join(root, "link")); err != nil {
		t.Fatal(err)
	}
	rel := func(paths []string) string {
		var out []string
		for _, p := range paths {
			r, _ := filepath.Rel(root, p)
			out = append(out, r)
		}
		slices.Sort(out)
		return strings.Join(out, " ")
	}
	tests := []struct {
		name   string
		bases  []string
		denied []string
		want   string
	}{
		{"nothing denied", []string{"."}, nil, "."},
		{"a file", []string{"."}, []string{"a/secret"}, "a/deep a/other b c"},
		{"a folder", []string{"."}, []string{"a"}, "b c"},
		{"two", []string{"."}, []string{"a/deep/x", "b"}, "a/other a/secret c"},
		{"a base beneath a denied path", []string{"a/deep", "b"}, []string{"a"}, "b"},
		{"a denied path that does not exist", []string{"."}, []string{"a/nothing"}, "a/deep a/other a/secret b c"},
		{"the base itself", []string{"b"}, []string{"b"}, ""},
	}
	for _, tt := range tests {
		abs := func(ps []string) []string {
			var out []string
			for _, p := range ps {
				out = append(out, filepath.Join(root, p))
			}
			return out
		}
		budget := maxRules
		got, err := complement(abs(tt.bases), abs(tt.denied), &budget)
		if err != nil {
			t.Fatalf("%s: %v", tt.name, err)
		}
		// The symbolic link is never allowed: it would grant its target.
		if g := rel(got); g != tt.want {
			t.Errorf("%s: %q, want %q", tt.name, g, tt.want)
		}
	}
	budget := 2
	if _, err := complement([]string{root}, []string{filepath.Join(root, "a/secret")}, &budget); err == nil {
		t.Error("the budget of rules is not held")
	}
}

// TestLandlockExec applies rules to a shell (this test's binary started
// as the agent would start it) and checks what it can and cannot do.
func TestLandlockExec(t *testing.T) {
	if os.Getenv("LANDLOCK_EXEC_ARGS") != "" {
		args := strings.Split(os.Getenv("LANDLOCK_EXEC_ARGS"), "\x1f")
		t.Fatal(LandlockExec(args))
	}
	if abi := LandlockABI(); abi < MinLandlockABI {
		t.Fatalf("this kernel offers Landlock ABI %d; filesystem rules need %d", abi, MinLandlockABI)
	}
	root := tree(t, "a/secret", "a/other", "b/file", "w/locked/f", "w/free", "w/sub/")
	rules := `{"allow_write":["` + root + `/w","` + root + `/made/here"],"deny_read":["` + root + `/a/secret"],"deny_write":["` + root + `/w/locked"]}`
	script := `
cd "$1"
try() { if eval "$2" >/dev/null 2>&1; then echo "$1 yes"; else echo "$1 no"; fi; }
try read-other 'cat a/other'
try read-secret 'cat a/secret'
try list-a 'ls a'
try list-b 'ls b'
try move-secret 'mv a/secret b/moved && cat b/moved'
try link-secret 'ln a/secret a/linked && cat a/linked'
try write-w 'echo x > w/new'
try write-w-sub 'echo x > w/sub/new'
try overwrite-w 'echo x > w/free'
try write-b 'echo x > b/new'
try write-locked 'echo x > w/locked/f'
try truncate-locked 'truncate -s 0 w/locked/f'
try make-in-made 'echo x > made/here/f'
try devnull 'echo x > /dev/null'
`
	cmd := exec.Command(os.Args[0], "-test.run=^TestLandlockExec$", "-test.v=false")
	cmd.Env = append(os.Environ(), "LANDLOCK_EXEC_ARGS="+strings.Join([]string{rules, "--", "/bin/sh", "-c", script, "sh", root}, "\x1f"))
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	want := map[string]string{
		"read-other": "yes", "read-secret": "no", "list-a": "no", "list-b": "yes", "move-secret": "no", "link-secret": "no",
		// w holds a denied folder: it is split, and gets no rights of
		// its own (no new entries); its other entries keep theirs.
		"write-w": "no", "write-w-sub": "yes", "overwrite-w": "yes", "write-b": "no", "write-locked": "no", "truncate-locked": "no",
		"make-in-made": "yes", "devnull": "yes",
	}
	got := map[string]string{}
	for _, line := range strings.Split(string(out), "\n") {
		if k, v, ok := strings.Cut(strings.TrimSpace(line), " "); ok {
			got[k] = v
		}
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s: %q, want %q", k, got[k], v)
		}
	}
	if t.Failed() {
		t.Logf("output:\n%s", out)
	}
}
