package workcopy

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/runbox-dev/runbox"
	"github.com/runbox-dev/runbox/internal/conversations"
	"github.com/runbox-dev/runbox/internal/files"
	"github.com/runbox-dev/runbox/internal/lifecycle"
	"github.com/runbox-dev/runbox/internal/s3store"
	"github.com/runbox-dev/runbox/internal/store"
	"github.com/runbox-dev/runbox/internal/testenv"
)

// listings counts the store's listings: a current copy makes none.
type listings struct {
	*s3store.Store
	n atomic.Int32
}

func (l *listings) List(ctx context.Context, conv string) ([]runbox.StoredFile, error) {
	l.n.Add(1)
	return l.Store.List(ctx, conv)
}

// executor is one executor's side: its folders and copies.
type executor struct {
	folders *files.Folders
	copies  *Copies
}

func newExecutor(t *testing.T, remote Remote, versions *store.Store) executor {
	t.Helper()
	f, err := files.NewFolders(t.TempDir(), files.Options{UID: os.Getuid(), GID: os.Getgid(), Quota: 1 << 20, Mode: files.QuotaWalk})
	if err != nil {
		t.Fatal(err)
	}
	return executor{folders: f, copies: New(remote, f, versions, os.Getuid(), os.Getgid(), slog.New(slog.DiscardHandler))}
}

// run is a run on the executor: pull, change the folder, push.
func (e executor) run(t *testing.T, cid string, change func(dir string)) {
	t.Helper()
	ctx := context.Background()
	dir, err := e.folders.Ensure(cid)
	if err != nil {
		t.Fatal(err)
	}
	if err := e.copies.Pull(ctx, cid, false); err != nil {
		t.Fatalf("pull: %v", err)
	}
	before, _ := e.folders.List(cid)
	change(dir)
	after, _ := e.folders.List(cid)
	if err := e.copies.Push(ctx, cid, before, after); err != nil {
		t.Fatalf("push: %v", err)
	}
}

func write(t *testing.T, dir, name, content string) {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

// stores opens the bucket, a conversation's quota a mebibyte, and the
// versions in Redis.
func stores(t *testing.T) (*s3store.Store, *store.Store) {
	t.Helper()
	s3, err := s3store.Open(context.Background(), testenv.S3(t, "runbox-files"), 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	return s3, store.New(store.NewConn(testenv.Client(t, testenv.Redis(t))))
}

// tree is the folder's regular files and contents, "name=content ...".
func tree(t *testing.T, dir string) string {
	t.Helper()
	var out []string
	filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			b, _ := os.ReadFile(p)
			rel, _ := filepath.Rel(dir, p)
			out = append(out, rel+"="+string(b))
		}
		return nil
	})
	return strings.Join(out, " ")
}

func TestCopiesFollowTheConversation(t *testing.T) {
	ctx := context.Background()
	s3, versions := stores(t)
	remote := &listings{Store: s3}
	a, b := newExecutor(t, remote, versions), newExecutor(t, remote, versions)
	const cid = "conv"

	a.run(t, cid, func(dir string) {
		write(t, dir, "keep.txt", "one")
		write(t, dir, "gone.txt", "x")
		write(t, dir, "out/deep/r.csv", "1,2")
		os.Symlink("/etc/passwd", filepath.Join(dir, "link"))
		syscall.Mkfifo(filepath.Join(dir, "fifo"), 0o644)
	})
	if got, _ := s3.List(ctx, cid); len(got) != 3 {
		t.Fatalf("store after the first run: %+v", got)
	}

	// The conversation moves to b: it finds a's files, nothing else.
	b.run(t, cid, func(dir string) {
		if got := tree(t, dir); got != "gone.txt=x keep.txt=one out/deep/r.csv=1,2" {
			t.Errorf("b's copy: %q", got)
		}
		os.Remove(filepath.Join(dir, "gone.txt"))
		write(t, dir, "keep.txt", "two")
		write(t, dir, "new.txt", "b")
	})

	// An upload through the api, then the conversation comes back to a.
	if _, err := s3.Write(ctx, cid, "up.bin", strings.NewReader("u"), 10, false); err != nil {
		t.Fatal(err)
	}
	if _, _, err := versions.FilesChanged(ctx, cid, -1, time.Now()); err != nil {
		t.Fatal(err)
	}
	a.run(t, cid, func(dir string) {
		if got := tree(t, dir); got != "keep.txt=two new.txt=b out/deep/r.csv=1,2 up.bin=u" {
			t.Errorf("a's copy back: %q", got)
		}
	})

	// A warm run on a current copy does not list the store.
	n := remote.n.Load()
	a.run(t, cid, func(string) {})
	if remote.n.Load() != n {
		t.Error("a current copy listed the store")
	}

	// The folder removed (the executor's janitor): the copy is made again.
	if err := a.folders.Remove(cid); err != nil {
		t.Fatal(err)
	}
	a.copies.Forget(cid)
	a.run(t, cid, func(dir string) {
		if got := tree(t, dir); got != "keep.txt=two new.txt=b out/deep/r.csv=1,2 up.bin=u" {
			t.Errorf("a's copy made again: %q", got)
		}
	})

	// Closed: the store's files and version go; every copy empties.
	if err := s3.Remove(ctx, cid); err != nil {
		t.Fatal(err)
	}
	if err := versions.FilesRemoved(ctx, cid); err != nil {
		t.Fatal(err)
	}
	b.run(t, cid, func(dir string) {
		if got := tree(t, dir); got != "" {
			t.Errorf("b's copy after close: %q", got)
		}
	})
}

// A file the store has replaces whatever a run left at its name, and one
// it does not have goes — unless other runs of the conversation are
// running (busy): what changed since the copy was in step is theirs,
// still being written, and stays, while what they did not touch follows
// the store.
func TestPullReplacesLocalChanges(t *testing.T) {
	ctx := context.Background()
	s3, versions := stores(t)
	for _, tc := range []struct {
		busy bool
		want string
	}{
		{false, "f=from a g=g h=h2"},
		{true, "f=local edit g=g h=h2 stray=x"},
	} {
		a := newExecutor(t, s3, versions)
		cid := fmt.Sprintf("conv-%v", tc.busy)
		a.run(t, cid, func(dir string) { write(t, dir, "f", "from a"); write(t, dir, "h", "h1") })
		// Written behind the copy's back (a push that never finished, or
		// a run still running).
		dir := a.folders.Path(cid)
		write(t, dir, "f", "local edit")
		write(t, dir, "stray", "x")
		for name, content := range map[string]string{"g": "g", "h": "h2"} {
			if _, err := s3.Write(ctx, cid, name, strings.NewReader(content), 10, true); err != nil {
				t.Fatal(err)
			}
		}
		versions.FilesChanged(ctx, cid, -1, time.Now())
		if err := a.copies.Pull(ctx, cid, tc.busy); err != nil {
			t.Fatal(err)
		}
		if got := tree(t, dir); got != tc.want {
			t.Errorf("busy %v: copy %q, want %q", tc.busy, got, tc.want)
		}
		r, _, err := s3.Open(ctx, cid, "f")
		if err != nil {
			t.Fatal(err)
		}
		if b, _ := io.ReadAll(r); string(b) != "from a" {
			t.Errorf("busy %v: the store's f is %q; a pull never sends", tc.busy, b)
		}
		r.Close()
	}
}

// flaky fails its puts while down, as a store that cannot be reached.
type flaky struct {
	*s3store.Store
	down bool
}

func (f *flaky) Put(ctx context.Context, conv, name string, r io.Reader, size int64) (runbox.StoredFile, error) {
	if f.down {
		return runbox.StoredFile{}, errors.New("the store cannot be reached")
	}
	return f.Store.Put(ctx, conv, name, r, size)
}

// A push that fails leaves the copy ahead of the store: the next run
// lists the store again, and the copy matches it.
func TestFailedPush(t *testing.T) {
	ctx := context.Background()
	s3, versions := stores(t)
	remote := &flaky{Store: s3}
	a := newExecutor(t, remote, versions)
	const cid = "conv"
	a.run(t, cid, func(dir string) { write(t, dir, "kept", "1") })

	dir := a.folders.Path(cid)
	before, _ := a.folders.List(cid)
	write(t, dir, "unsaved", "2")
	after, _ := a.folders.List(cid)
	remote.down = true
	if err := a.copies.Push(ctx, cid, before, after); err == nil {
		t.Fatal("push to a store that cannot be reached succeeded")
	}
	remote.down = false
	a.run(t, cid, func(dir string) {
		if got := tree(t, dir); got != "kept=1" {
			t.Errorf("copy after a failed push: %q", got)
		}
	})
}

// TestJanitorForgetsRemovedCopy: a working copy the janitor removes is
// fetched whole by the conversation's next run, even one that found the
// folder there just before the removal (and so had no reason to forget
// it) and has it made again, empty.
func TestJanitorForgetsRemovedCopy(t *testing.T) {
	ctx := context.Background()
	s3, versions := stores(t)
	a := newExecutor(t, s3, versions)
	const cid = "conv"
	a.run(t, cid, func(dir string) { write(t, dir, "f", "kept") })
	long := time.Now().Add(-time.Hour)
	os.Chtimes(filepath.Join(a.folders.Root(), cid), long, long)
	j := conversations.NewJanitor(a.folders, versions, time.Minute, 2*time.Minute,
		lifecycle.Periodic(clockwork.NewRealClock()), slog.New(slog.DiscardHandler))
	j.BeforeRemove(a.copies.Forget)
	j.Sweep(ctx)
	if _, err := os.Stat(filepath.Join(a.folders.Root(), cid)); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("the idle copy was not removed: %v", err)
	}
	dir, err := a.folders.Ensure(cid)
	if err != nil {
		t.Fatal(err)
	}
	if err := a.copies.Pull(ctx, cid, false); err != nil {
		t.Fatal(err)
	}
	if got := tree(t, dir); got != "f=kept" {
		t.Errorf("the copy after its removal: %q, want the store's files", got)
	}
}

// A saved state kept in the store takes its room from every copy of the
// conversation: the one whose executor saved or removed it at once, any
// other at its next run.
func TestCopiesHoldTheState(t *testing.T) {
	ctx := context.Background()
	s3, versions := stores(t)
	a, b := newExecutor(t, s3, versions), newExecutor(t, s3, versions)
	const cid, state = "conv-state", 300 << 10
	a.run(t, cid, func(dir string) { write(t, dir, "f", "abc") })
	b.run(t, cid, func(string) {})
	usage := func(e executor) int64 {
		t.Helper()
		used, free, err := e.folders.Usage(cid)
		if err != nil {
			t.Fatal(err)
		}
		if used+free != 1<<20 {
			t.Errorf("used %d + free %d is not the quota", used, free)
		}
		return used
	}
	files := usage(a)

	if _, err := a.copies.PutState(ctx, cid, strings.NewReader(strings.Repeat("s", state)), state); err != nil {
		t.Fatal(err)
	}
	if got := usage(a); got != files+state {
		t.Errorf("a's copy after the pause: used %d, want %d", got, files+state)
	}
	b.run(t, cid, func(string) {})
	if got := usage(b); got != files+state {
		t.Errorf("b's copy at its next run: used %d, want %d", got, files+state)
	}

	if err := b.copies.RemoveState(ctx, cid); err != nil {
		t.Fatal(err)
	}
	if got := usage(b); got != files {
		t.Errorf("b's copy after the restore: used %d, want %d", got, files)
	}
	a.run(t, cid, func(string) {})
	if got := usage(a); got != files {
		t.Errorf("a's copy at its next run: used %d, want %d", got, files)
	}
}
