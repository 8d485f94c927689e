package rules

import (
	"path"
	"slices"
	"strings"
	"testing"
)

func TestPath(t *testing.T) {
	tests := []struct {
		path string
		ok   bool
	}{
		{"report.md", true},
		{"docs/2026/summary.csv", true},
		{"src/app_v2-final.py", true},
		{"environment.yml", true}, // .env is a prefix of a part, not of any word
		{"gitlog.txt", true},
		{"docs/env/.keep", true},
		{"", false},
		{"../x", false},
		{"a/../../x", false},
		{"a/..", false},
		{"./a", false},
		{"a//b", false},
		{"a/", false},
		{"/etc/passwd", false},
		{"/root/.ssh/id_rsa", false},
		{"/abs", false},
		{".env", false},
		{".env.local", false},
		{"sub/.env", false},
		{".ENV", false},
		{".git/config", false},
		{".git", false},
		{".gitmodules", false},
		{".gitattributes", false},
		{".github/workflows/ci.yml", false},
		{"pkg/.github/x", false},
		{".gitlab-ci.yml", false},
		{"node_modules/x/index.js", false},
		{"web/node_modules_old/x", false},
		{".codesandbox/tasks.json", false},
		{"a b.txt", false},
		{`a\b`, false},
		{"a\x00b", false},
		{"ünïcode.md", false},
		{"a?.md", false},
		{strings.Repeat("a", MaxPath+1), false},
	}
	for _, tt := range tests {
		err := Path(tt.path)
		if (err == nil) != tt.ok {
			t.Errorf("Path(%q) = %v, want ok=%v", tt.path, err, tt.ok)
		}
		if err != nil && tt.path != "" && strings.Contains(err.Error(), tt.path) && !slices.Contains(forbidden, tt.path) {
			t.Errorf("Path(%q): the error %q repeats the path", tt.path, err)
		}
	}
}

func TestBranch(t *testing.T) {
	tests := []struct {
		branch string
		ok     bool
	}{
		{"runbox/fix-1", true},
		{"feature/a.b_c", true},
		{"main", true},
		{"", false},
		{"a..b", false},
		{"a//b", false},
		{"/a", false},
		{"a/", false},
		{"-a", false},
		{"a.", false},
		{"a/.b", false},
		{".a", false},
		{"a.lock", false},
		{"a.lock/b", false},
		{"HEAD", false},
		{"a b", false},
		{"a~1", false},
		{"a^", false},
		{"a:b", false},
		{"a@{1}", false},
		{"refs/heads/../x", false},
		{strings.Repeat("b", MaxBranch+1), false},
	}
	for _, tt := range tests {
		if err := Branch(tt.branch); (err == nil) != tt.ok {
			t.Errorf("Branch(%q) = %v, want ok=%v", tt.branch, err, tt.ok)
		}
	}
}

func TestMatchBranch(t *testing.T) {
	globs := []string{"runbox/*", "agent-?"}
	for b, want := range map[string]bool{
		"runbox/x": true, "runbox/x/y": false, "agent-1": true, "agent-12": false, "main": false, "runbox": false,
	} {
		if got := MatchBranch(globs, b); got != want {
			t.Errorf("MatchBranch(%q) = %v", b, got)
		}
	}
	if MatchBranch([]string{"["}, "x") || ValidGlob("[") || ValidGlob("") || !ValidGlob("runbox/*") {
		t.Error("a bad glob matched or was valid")
	}
}

// FuzzPath: whatever a client sends, an accepted path stays inside the
// repository, is relative and clean, names none of the forbidden files,
// and is made only of the gateway's characters.
func FuzzPath(f *testing.F) {
	for _, s := range []string{"report.md", "../x", ".git/config", ".env", "a/b/c.txt", "a//b", "/etc/passwd",
		"node_modules/a", "x/.github/w", ".", "a/./b", "a/b/..", "%2e%2e/x", "..\\x", "a\x00"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, p string) {
		if Path(p) != nil {
			return
		}
		if path.IsAbs(p) || path.Clean(p) != p || path.Clean("/"+p) != "/"+p {
			t.Fatalf("accepted %q, which is not a clean relative path", p)
		}
		if !gatewayChars.MatchString(p) || len(p) > MaxPath {
			t.Fatalf("accepted %q, outside the gateway's pattern", p)
		}
		for seg := range strings.SplitSeq(p, "/") {
			lower := strings.ToLower(seg)
			if seg == ".." || seg == "." || seg == "" || strings.HasPrefix(lower, ".git") || strings.HasPrefix(lower, ".env") ||
				strings.HasPrefix(lower, "node_modules") || strings.HasPrefix(lower, ".codesandbox") {
				t.Fatalf("accepted %q, which holds the part %q", p, seg)
			}
		}
	})
}

// FuzzBranch: an accepted branch is one git takes as written.
func FuzzBranch(f *testing.F) {
	for _, s := range []string{"runbox/a", "a..b", "a//b", "-x", "x.lock", ".x", "HEAD", "a/b/", "x@{1}"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, b string) {
		if Branch(b) != nil {
			return
		}
		if !gatewayChars.MatchString(b) || strings.Contains(b, "..") || strings.Contains(b, "//") ||
			strings.HasPrefix(b, "/") || strings.HasSuffix(b, "/") || strings.HasPrefix(b, "-") || b == "HEAD" {
			t.Fatalf("accepted %q", b)
		}
		for seg := range strings.SplitSeq(b, "/") {
			if seg == "" || strings.HasPrefix(seg, ".") || strings.HasSuffix(seg, ".lock") {
				t.Fatalf("accepted %q with the part %q", b, seg)
			}
		}
	})
}
