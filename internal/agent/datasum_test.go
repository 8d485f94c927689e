package agent

import (
	"os"
	"path/filepath"
	"testing"
	"time"
)

func TestDataSum(t *testing.T) {
	write := func(t *testing.T, path, body string) {
		t.Helper()
		if err := os.WriteFile(path, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	tests := []struct {
		name    string
		change  func(t *testing.T, dir string)
		changed bool
	}{
		{"nothing", func(*testing.T, string) {}, false},
		{"a read", func(t *testing.T, dir string) {
			if _, err := os.ReadFile(filepath.Join(dir, "a.txt")); err != nil {
				t.Fatal(err)
			}
		}, false},
		{"a new file", func(t *testing.T, dir string) { write(t, filepath.Join(dir, "b.txt"), "b") }, true},
		{"a file rewritten, same size, its times put back", func(t *testing.T, dir string) {
			path := filepath.Join(dir, "a.txt")
			info, err := os.Stat(path)
			if err != nil {
				t.Fatal(err)
			}
			write(t, path, "A")
			if err := os.Chtimes(path, info.ModTime(), info.ModTime()); err != nil {
				t.Fatal(err)
			}
		}, true},
		{"a rename", func(t *testing.T, dir string) {
			if err := os.Rename(filepath.Join(dir, "a.txt"), filepath.Join(dir, "c.txt")); err != nil {
				t.Fatal(err)
			}
		}, true},
		{"a removal deep down", func(t *testing.T, dir string) {
			if err := os.Remove(filepath.Join(dir, "sub", "d.txt")); err != nil {
				t.Fatal(err)
			}
		}, true},
		{"a mode", func(t *testing.T, dir string) {
			if err := os.Chmod(filepath.Join(dir, "a.txt"), 0o600); err != nil {
				t.Fatal(err)
			}
		}, true},
		{"a link", func(t *testing.T, dir string) {
			if err := os.Symlink("/etc/passwd", filepath.Join(dir, "l")); err != nil {
				t.Fatal(err)
			}
		}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			write(t, filepath.Join(dir, "a.txt"), "a")
			if err := os.Mkdir(filepath.Join(dir, "sub"), 0o755); err != nil {
				t.Fatal(err)
			}
			write(t, filepath.Join(dir, "sub", "d.txt"), "d")
			before := dataSum(dir)
			if before == "" {
				t.Fatal("no sum")
			}
			time.Sleep(10 * time.Millisecond) // a change's times differ from the files'
			tt.change(t, dir)
			if after := dataSum(dir); (after != before) != tt.changed {
				t.Errorf("changed: %v, want %v", after != before, tt.changed)
			}
		})
	}
	if dataSum(filepath.Join(t.TempDir(), "missing")) != "" {
		t.Error("a folder that cannot be walked has a sum")
	}
}
