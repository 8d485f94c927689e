package files

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/runbox-dev/runbox"
)

// writeTree fills a conversation's folder with what a program may leave:
// files in folders, installed packages, a link, a FIFO.
func writeTree(t *testing.T, dir string) {
	t.Helper()
	for name, body := range map[string]string{
		"data.csv":      "a,b\n1,2\n",
		"out/chart.png": "\x89PNG",
		"run.sh":        "#!/bin/sh\necho hi\n",
		PackagesDir + "/python/lib/python3.11/site-packages/tinypkg-0.1.0.dist-info/METADATA": "Name: tinypkg",
	} {
		p := filepath.Join(dir, name)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	os.Chmod(filepath.Join(dir, "run.sh"), 0o755)
	os.Symlink("../../etc/passwd", filepath.Join(dir, "link"))
	syscall.Mkfifo(filepath.Join(dir, "fifo"), 0o644)
}

func readFile(t *testing.T, p string) string {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func TestFork(t *testing.T) {
	for _, mode := range []QuotaMode{QuotaWalk, QuotaLoop} {
		t.Run(string(mode), func(t *testing.T) {
			f, src := newFoldersIn(t, mode)
			writeTree(t, src)
			old := time.Date(2020, 1, 2, 3, 4, 5, 0, time.UTC)
			os.Chtimes(filepath.Join(src, "data.csv"), old, old)

			got, err := f.Fork(context.Background(), "conv1", "~alice~fork")
			if err != nil {
				t.Fatal(err)
			}
			if got.Files != 4 || got.Bytes == 0 || !got.Packages {
				t.Errorf("forked %+v, want 4 files and the packages", got)
			}
			dst := f.Path("~alice~fork")
			for _, name := range []string{"data.csv", "out/chart.png", "run.sh",
				PackagesDir + "/python/lib/python3.11/site-packages/tinypkg-0.1.0.dist-info/METADATA"} {
				if a, b := readFile(t, filepath.Join(src, name)), readFile(t, filepath.Join(dst, name)); a != b {
					t.Errorf("%s: fork has %q, source %q", name, b, a)
				}
			}
			if info, err := os.Stat(filepath.Join(dst, "run.sh")); err != nil || info.Mode().Perm() != 0o755 {
				t.Errorf("run.sh lost its mode: %v, %v", info, err)
			}
			if info, err := os.Stat(filepath.Join(dst, "data.csv")); err != nil || !info.ModTime().Equal(old) {
				t.Errorf("data.csv lost its time: %v, %v", info, err)
			}
			if target, err := os.Readlink(filepath.Join(dst, "link")); err != nil || target != "../../etc/passwd" {
				t.Errorf("link: %q, %v", target, err)
			}
			if _, err := os.Lstat(filepath.Join(dst, "fifo")); err == nil {
				t.Error("a FIFO was copied")
			}
			if entries, _ := os.ReadDir(filepath.Join(f.Root(), forksDir)); len(entries) != 0 {
				t.Errorf("the fork's staging folder stayed: %v", entries)
			}
			// What a process that stopped mid-fork left goes with the next fork.
			stale := filepath.Join(f.Root(), forksDir, "x-stale")
			os.MkdirAll(filepath.Join(stale, "files"), 0o755)
			os.Chtimes(stale, old, old)

			// Copies, not links: a write to either shows in it alone.
			os.WriteFile(filepath.Join(dst, "data.csv"), []byte("fork"), 0o644)
			os.WriteFile(filepath.Join(src, "out/chart.png"), []byte("source"), 0o644)
			if got := readFile(t, filepath.Join(src, "data.csv")); got != "a,b\n1,2\n" {
				t.Errorf("a write to the fork changed the source: %q", got)
			}
			if got := readFile(t, filepath.Join(dst, "out/chart.png")); got != "\x89PNG" {
				t.Errorf("a write to the source changed the fork: %q", got)
			}

			if _, err := f.Fork(context.Background(), "conv1", "~alice~fork"); runbox.ErrorCode(err) != runbox.EConversationExists {
				t.Errorf("fork onto an existing conversation: %v", err)
			}
			// A source with no folder forks as an empty conversation.
			if got, err := f.Fork(context.Background(), "never", "~alice~empty"); err != nil || got.Files != 0 || !f.Exists("~alice~empty") {
				t.Errorf("fork of nothing: %+v, %v", got, err)
			}
			if _, err := os.Stat(stale); err == nil {
				t.Error("a stale staging folder stayed")
			}
		})
	}
}

// TestForkOverQuota: in loop mode the fork's image holds it to the quota;
// a fork that does not fit leaves nothing.
func TestForkOverQuota(t *testing.T) {
	needLoop(t, QuotaLoop)
	root := t.TempDir()
	t.Cleanup(func() { unmountAll(root) })
	big, err := NewFolders(root, Options{UID: 0, GID: 0, Quota: 8 << 20, Mode: QuotaWalk})
	if err != nil {
		t.Fatal(err)
	}
	src, err := big.Ensure("conv1")
	if err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(src, "big"), make([]byte, 6<<20), 0o644)
	small, err := NewFolders(root, Options{UID: 0, GID: 0, Quota: 4 << 20, Mode: QuotaLoop})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := small.Fork(context.Background(), "conv1", "fork"); runbox.ErrorCode(err) != runbox.EQuotaExceeded {
		t.Fatalf("fork past the quota: %v", err)
	}
	if small.Exists("fork") {
		t.Error("a failed fork left its folder")
	}
	if entries, _ := os.ReadDir(filepath.Join(root, forksDir)); len(entries) != 0 {
		t.Errorf("a failed fork left its staging folder: %v", entries)
	}
}

// TestForkReflinks forks on XFS, whose files share blocks copy-on-write:
// every file is a reflink, and still a write to either copy shows in it
// alone. ext4 (TestFork's walk mode, here) falls back to copying bytes.
func TestForkReflinks(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("mounting an XFS image needs root")
	}
	if _, err := exec.LookPath("mkfs.xfs"); err != nil {
		t.Skip("mkfs.xfs is not installed (xfsprogs)")
	}
	dir := t.TempDir()
	img, mnt := filepath.Join(dir, "xfs.img"), filepath.Join(dir, "mnt")
	if err := os.WriteFile(img, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(img, 512<<20); err != nil { // XFS's smallest is 300 MB
		t.Fatal(err)
	}
	if out, err := exec.Command("mkfs.xfs", "-q", "-m", "reflink=1", img).CombinedOutput(); err != nil {
		t.Fatalf("mkfs.xfs: %v: %s", err, out)
	}
	os.Mkdir(mnt, 0o755)
	if err := run("mount", "-o", "loop", img, mnt); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unmount(mnt) })

	f, err := NewFolders(mnt, Options{UID: 0, GID: 0, Quota: 64 << 20, Mode: QuotaWalk})
	if err != nil {
		t.Fatal(err)
	}
	src, err := f.Ensure("conv1")
	if err != nil {
		t.Fatal(err)
	}
	writeTree(t, src)
	got, err := f.Fork(context.Background(), "conv1", "fork")
	if err != nil {
		t.Fatal(err)
	}
	if got.Files != 4 || got.Cloned != 4 {
		t.Errorf("forked %+v, want 4 files, all reflinks", got)
	}
	dst := f.Path("fork")
	os.WriteFile(filepath.Join(dst, "data.csv"), []byte("fork"), 0o644)
	if got := readFile(t, filepath.Join(src, "data.csv")); got != "a,b\n1,2\n" {
		t.Errorf("a write to the reflinked fork changed the source: %q", got)
	}
}

// TestCloneFallsBack: where FICLONE is refused (ext4, or two file
// systems), the bytes are copied.
func TestCloneFallsBack(t *testing.T) {
	dir := t.TempDir()
	in, err := os.Create(filepath.Join(dir, "in"))
	if err != nil {
		t.Fatal(err)
	}
	in.WriteString("hello, world")
	in.Seek(0, 0)
	out, err := os.Create(filepath.Join(dir, "out"))
	if err != nil {
		t.Fatal(err)
	}
	cloned, _, err := cloneFile(out, in, 12, 12)
	out.Close()
	in.Close()
	if err != nil {
		t.Fatal(err)
	}
	var st syscall.Statfs_t
	syscall.Statfs(dir, &st)
	const ext4 = 0xef53
	if st.Type == ext4 && cloned {
		t.Error("ext4 reported a reflink")
	}
	if got := readFile(t, filepath.Join(dir, "out")); got != "hello, world" {
		t.Errorf("copy has %q", got)
	}
}
