package kubernetes

import (
	"archive/tar"
	"bytes"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/runbox-dev/runbox/internal/agent"
	"github.com/runbox-dev/runbox/internal/sparse/sparsetest"
)

// entry is one entry of a test archive.
type entry struct {
	name, body, link string
	dir              bool
}

func archive(t *testing.T, entries ...entry) *bytes.Buffer {
	t.Helper()
	var b bytes.Buffer
	tw := tar.NewWriter(&b)
	mtime := time.Unix(1700000000, 0)
	for _, e := range entries {
		hdr := &tar.Header{Name: e.name, Mode: 0o644, ModTime: mtime, Typeflag: tar.TypeReg, Size: int64(len(e.body))}
		switch {
		case e.dir:
			hdr.Typeflag, hdr.Mode, hdr.Size = tar.TypeDir, 0o755, 0
		case e.link != "":
			hdr.Typeflag, hdr.Linkname, hdr.Size = tar.TypeSymlink, e.link, 0
		}
		if err := tw.WriteHeader(hdr); err != nil {
			t.Fatal(err)
		}
		if _, err := tw.Write([]byte(e.body)); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
	return &b
}

func readInto(t *testing.T, dir string, q agent.Quota, entries ...entry) error {
	t.Helper()
	root, err := os.OpenRoot(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer root.Close()
	return readTar(archive(t, entries...), root, q)
}

func TestCopyOutMirrors(t *testing.T) {
	dir := t.TempDir()
	for name, body := range map[string]string{"stale.txt": "old", "keep.txt": "old", "gone/deep.txt": "x"} {
		os.MkdirAll(filepath.Join(dir, filepath.Dir(name)), 0o755)
		os.WriteFile(filepath.Join(dir, name), []byte(body), 0o644)
	}
	err := readInto(t, dir, agent.Quota{},
		entry{name: "./", dir: true},
		entry{name: "./keep.txt", body: "new"},
		entry{name: "./sub", dir: true},
		entry{name: "./sub/a.csv", body: "1,2"},
		entry{name: "./link", link: "sub/a.csv"},
	)
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]string{}
	filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		rel, _ := filepath.Rel(dir, p)
		switch {
		case d.Type()&os.ModeSymlink != 0:
			l, _ := os.Readlink(p)
			got[rel] = "-> " + l
		case !d.IsDir():
			b, _ := os.ReadFile(p)
			got[rel] = string(b)
		}
		return nil
	})
	want := map[string]string{"keep.txt": "new", "sub/a.csv": "1,2", "link": "-> sub/a.csv"}
	if len(got) != len(want) {
		t.Fatalf("got %v; want %v", got, want)
	}
	for k, v := range want {
		if got[k] != v {
			t.Errorf("%s: %q; want %q", k, got[k], v)
		}
	}
	if st, _ := os.Stat(filepath.Join(dir, "keep.txt")); !st.ModTime().Equal(time.Unix(1700000000, 0)) {
		t.Errorf("mtime not kept: %v", st.ModTime())
	}
}

func TestCopyOutRefusesEscapes(t *testing.T) {
	outside := t.TempDir()
	secret := filepath.Join(outside, "secret")
	os.WriteFile(secret, []byte("host"), 0o644)
	tests := []struct {
		name    string
		entries []entry
	}{
		{"parent", []entry{{name: "../x", body: "evil"}}},
		{"absolute", []entry{{name: secret, body: "evil"}}},
		{"through a link to a folder", []entry{{name: "l", link: outside}, {name: "l/secret", body: "evil"}}},
		{"onto a link to a file", []entry{{name: "s", link: secret}, {name: "s", body: "evil"}}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			_ = readInto(t, dir, agent.Quota{}, tt.entries...)
			if b, _ := os.ReadFile(secret); string(b) != "host" {
				t.Fatalf("the archive wrote outside the folder: %q", b)
			}
		})
	}
}

// TestCopyOutQuota: an archive past the quota, in bytes or in entries,
// is taken up to it, and the folder then holds only what was taken:
// neither what it held before nor anything past the quota.
func TestCopyOutQuota(t *testing.T) {
	many := make([]entry, 50)
	for i := range many {
		many[i] = entry{name: fmt.Sprintf("f%02d", i)}
	}
	tests := []struct {
		name    string
		quota   agent.Quota
		entries []entry
		want    []string // what the folder holds after
	}{
		{name: "bytes", quota: agent.Quota{Bytes: 10},
			entries: []entry{{name: "a", body: "12345"}, {name: "b", body: strings.Repeat("x", 6)}}, want: []string{"a"}},
		{name: "entries", quota: agent.Quota{Entries: 3},
			entries: append([]entry{{name: "d", dir: true}, {name: "d/in"}}, many...), want: []string{"d", "d/in", "f00"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			for _, old := range []string{"old1", "old2", "f00"} {
				if err := os.WriteFile(filepath.Join(dir, old), []byte("before"), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			err := readInto(t, dir, tt.quota, tt.entries...)
			if !errors.Is(err, ErrTooLarge) {
				t.Fatalf("err = %v; want ErrTooLarge", err)
			}
			var got []string
			filepath.WalkDir(dir, func(path string, _ fs.DirEntry, err error) error {
				if rel, _ := filepath.Rel(dir, path); err == nil && rel != "." {
					got = append(got, rel)
				}
				return nil
			})
			if !slices.Equal(got, tt.want) {
				t.Errorf("the folder holds %q; want %q", got, tt.want)
			}
		})
	}
}

func TestWriteTarRoundTrips(t *testing.T) {
	src, dst := t.TempDir(), t.TempDir()
	os.MkdirAll(filepath.Join(src, "d/e"), 0o755)
	os.WriteFile(filepath.Join(src, "d/e/f.txt"), []byte("deep"), 0o644)
	os.Symlink("d/e/f.txt", filepath.Join(src, "l"))
	var b bytes.Buffer
	if err := writeTar(&b, src); err != nil {
		t.Fatal(err)
	}
	root, _ := os.OpenRoot(dst)
	defer root.Close()
	if err := readTar(&b, root, agent.Quota{}); err != nil {
		t.Fatal(err)
	}
	if got, err := os.ReadFile(filepath.Join(dst, "l")); err != nil || string(got) != "deep" {
		t.Fatalf("l: %q, %v", got, err)
	}
}

// TestCopyOutKeepsHoles: tar carries a sparse file's holes as zeros;
// the executor's copy leaves them holes again.
func TestCopyOutKeepsHoles(t *testing.T) {
	dir := t.TempDir()
	body := make([]byte, 4<<20)
	copy(body, sparsetest.Data)
	copy(body[len(body)-4096:], sparsetest.Data)
	if err := readInto(t, dir, agent.Quota{}, entry{name: "sparse", body: string(body)}); err != nil {
		t.Fatal(err)
	}
	sparsetest.Check(t, filepath.Join(dir, "sparse"), int64(len(body)))
}
