package runbox

import (
	"path/filepath"
	"strings"
	"testing"
)

func FuzzCleanFileName(f *testing.F) {
	for _, s := range []string{"a.csv", "../x", "/etc/passwd", "a/b", ".env", "a\x00b", "sub/../x", "/data/x", strings.Repeat("a", 300)} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, name string) {
		clean, err := CleanFileName(name)
		if err != nil {
			return
		}
		if filepath.IsAbs(clean) || strings.Contains(clean, "\x00") || !filepath.IsLocal(clean) {
			t.Fatalf("CleanFileName(%q) = %q: not a local path", name, clean)
		}
	})
}

func FuzzValidFileName(f *testing.F) {
	for _, s := range []string{"data.csv", "../x", "/etc/passwd", "a/b", ".env", "a\x00b", strings.Repeat("a", 300), "..", "-rf", "a..b"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, name string) {
		if !ValidFileName(name) {
			return
		}
		if len(name) > 255 || strings.HasPrefix(name, ".") || strings.ContainsAny(name, "/\\\x00") || !filepath.IsLocal(name) ||
			filepath.Base(name) != name {
			t.Fatalf("ValidFileName accepted %q", name)
		}
	})
}

func TestCleanFileNameMntData(t *testing.T) {
	for in, want := range map[string]string{"/mnt/data/a/b.csv": "a/b.csv", "/data/x.png": "x.png", "y.txt": "y.txt"} {
		if got, err := CleanFileName(in); err != nil || got != want {
			t.Errorf("CleanFileName(%q) = %q, %v; want %q", in, got, err, want)
		}
	}
	for _, bad := range []string{"/mnt/data/../etc/passwd", "/mnt/data/", "/mnt/other/x"} {
		if _, err := CleanFileName(bad); err == nil {
			t.Errorf("CleanFileName(%q) accepted", bad)
		}
	}
}
