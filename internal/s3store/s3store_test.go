package s3store_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/runbox-dev/runbox"
	"github.com/runbox-dev/runbox/internal/s3store"
	"github.com/runbox-dev/runbox/internal/testenv"
)

func open(t *testing.T, quota int64) *s3store.Store {
	t.Helper()
	cfg := testenv.S3(t, "runbox-files")
	cfg.Prefix = "test/"
	s, err := s3store.Open(context.Background(), cfg, quota)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func names(fs []runbox.StoredFile) string {
	var out []string
	for _, f := range fs {
		out = append(out, f.Name)
	}
	return strings.Join(out, " ")
}

func TestStore(t *testing.T) {
	ctx := context.Background()
	s := open(t, 100)
	const conv = "~alice~c1"

	if err := s.Ping(ctx); err != nil {
		t.Fatalf("ping: %v", err)
	}
	if ok, err := s.Exists(ctx, conv); err != nil || ok {
		t.Fatalf("new conversation exists: %v, %v", ok, err)
	}
	f, err := s.Write(ctx, conv, "a.txt", strings.NewReader("hello"), 50, false)
	if err != nil || f.Name != "a.txt" || f.Size != 5 || f.ETag == "" {
		t.Fatalf("write: %+v, %v", f, err)
	}
	if _, err := s.Put(ctx, conv, "out/b.csv", strings.NewReader("1,2"), 3); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name      string
		file      string
		body      string
		overwrite bool
		code      string
	}{
		{"taken", "a.txt", "x", false, runbox.EFileExists},
		{"over the limit", "big", strings.Repeat("x", 51), false, runbox.ETooLarge},
		{"over the quota", "q", strings.Repeat("x", 50), true, ""},
		{"quota counts all files", "q2", strings.Repeat("x", 45), false, runbox.EQuotaExceeded},
		{"overwrite frees the old size", "q", strings.Repeat("y", 50), true, ""},
		{"hidden name", ".env", "x", false, runbox.EInvalidPath},
		{"path", "../x", "x", false, runbox.EInvalidPath},
	}
	for _, tt := range tests {
		_, err := s.Write(ctx, conv, tt.file, strings.NewReader(tt.body), 50, tt.overwrite)
		if tt.code == "" && err != nil || tt.code != "" && runbox.ErrorCode(err) != tt.code {
			t.Errorf("%s: error %v, want code %q", tt.name, err, tt.code)
		}
	}

	list, err := s.List(ctx, conv)
	if err != nil || names(list) != "a.txt out/b.csv q" {
		t.Fatalf("list: %q, %v", names(list), err)
	}
	r, info, err := s.Open(ctx, conv, "/data/out/b.csv")
	if err != nil || info.Size != 3 {
		t.Fatalf("open: %+v, %v", info, err)
	}
	if _, err := r.Seek(2, io.SeekStart); err != nil {
		t.Fatal(err)
	}
	if b, _ := io.ReadAll(r); string(b) != "2" {
		t.Errorf("read after seek: %q", b)
	}
	r.Close()
	if _, _, err := s.Open(ctx, conv, "missing"); runbox.ErrorCode(err) != runbox.ENotFound {
		t.Errorf("missing file: %v", err)
	}
	// Another client's conversation of the same id is another folder.
	if _, _, err := s.Open(ctx, "c1", "a.txt"); runbox.ErrorCode(err) != runbox.ENotFound {
		t.Errorf("default client's c1 reads alice's: %v", err)
	}
	if _, err := s.List(ctx, "../x"); runbox.ErrorCode(err) != runbox.EInvalid {
		t.Errorf("invalid key: %v", err)
	}
	if used, err := s.ClientUsage(ctx, "alice"); err != nil || used != 5+3+50 {
		t.Errorf("alice uses %d, %v", used, err)
	}
	if used, err := s.ClientUsage(ctx, "default"); err != nil || used != 0 {
		t.Errorf("default uses %d, %v", used, err)
	}

	if err := s.Delete(ctx, conv, []string{"q", "never"}); err != nil {
		t.Fatal(err)
	}
	if err := s.Remove(ctx, conv); err != nil {
		t.Fatal(err)
	}
	if ok, err := s.Exists(ctx, conv); err != nil || ok {
		t.Errorf("removed conversation exists: %v, %v", ok, err)
	}
}

// Objects put in the bucket by anyone else are never served under names a
// run could not have written.
func TestForeignKeys(t *testing.T) {
	ctx := context.Background()
	s := open(t, 1<<20)
	for _, key := range []string{"test/default/c/ok.txt", "test/default/c/back\\slash",
		"test/default/c/" + strings.Repeat("d/", 10) + "deep"} {
		if err := s.PutForeign(ctx, key); err != nil {
			t.Fatalf("put %s: %v", key, err)
		}
	}
	list, err := s.List(ctx, "c")
	if err != nil || names(list) != "ok.txt" {
		t.Errorf("list = %q, %v", names(list), err)
	}
}

func TestOpenRefusesBadEndpoint(t *testing.T) {
	cfg := testenv.S3(t, "runbox-files")
	cfg.Endpoint = "ftp://x"
	if _, err := s3store.Open(context.Background(), cfg, 1); err == nil {
		t.Error("ftp endpoint accepted")
	}
	cfg.Endpoint, cfg.SecretKey = testenv.S3(t, "runbox-files").Endpoint, "wrong"
	_, err := s3store.Open(context.Background(), cfg, 1)
	if err == nil || errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("wrong secret: %v", err)
	}
}

// Names a run may write, as keys: spaces, non-ASCII letters, characters
// URLs and S3 treat specially.
func TestNames(t *testing.T) {
	ctx := context.Background()
	s := open(t, 1<<20)
	want := []string{"a b.txt", "dir/ünïcødé.csv", "q?x#y%20z&.md", "plus+sign", "deep/er/still/f"}
	for _, n := range want {
		if _, err := s.Put(ctx, "c", n, strings.NewReader(n), int64(len(n))); err != nil {
			t.Fatalf("put %q: %v", n, err)
		}
	}
	list, err := s.List(ctx, "c")
	if err != nil || len(list) != len(want) {
		t.Fatalf("list %q, %v", names(list), err)
	}
	for _, n := range want {
		r, _, err := s.Open(ctx, "c", n)
		if err != nil {
			t.Fatalf("open %q: %v", n, err)
		}
		b, _ := io.ReadAll(r)
		r.Close()
		if string(b) != n {
			t.Errorf("%q holds %q", n, b)
		}
	}
}

// gate is an upload body that yields nothing until closed, then EOF: a
// slow client.
type gate chan struct{}

func (g gate) Read([]byte) (int, error) { <-g; return 0, io.EOF }

// TestSpoolingBounded: uploads spool to the local disk at most s3store.MaxSpooling
// at once, so slow clients cannot fill it; the others wait their turn.
func TestSpoolingBounded(t *testing.T) {
	tmp := t.TempDir()
	t.Setenv("TMPDIR", tmp)
	ctx := context.Background()
	s := open(t, 1<<20)
	g := make(gate)
	errs := make(chan error, s3store.MaxSpooling+4)
	for i := range s3store.MaxSpooling + 4 {
		go func() {
			_, err := s.Write(ctx, "c", fmt.Sprintf("f%d", i), g, 100, false)
			errs <- err
		}()
	}
	spooled := func() int { e, _ := os.ReadDir(tmp); return len(e) }
	deadline := time.Now().Add(10 * time.Second)
	for spooled() < s3store.MaxSpooling && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	time.Sleep(100 * time.Millisecond) // room for a wrong ninth
	if n := spooled(); n != s3store.MaxSpooling {
		t.Errorf("%d uploads spooled at once, want %d", n, s3store.MaxSpooling)
	}
	close(g)
	for range s3store.MaxSpooling + 4 {
		if err := <-errs; err != nil {
			t.Error(err)
		}
	}
	if n := spooled(); n != 0 {
		t.Errorf("%d spool files left", n)
	}
}

// TestFork copies a conversation's objects in the bucket: the fork has
// them all, under the new conversation, and the two diverge from then on.
func TestFork(t *testing.T) {
	ctx := context.Background()
	s := open(t, 1<<20)
	const src, dst = "~alice~src", "~alice~fork"
	want := map[string]string{"a.txt": "hello", "out/b.csv": "1,2", "deep/er/ünï.md": "x"}
	for n, body := range want {
		if _, err := s.Put(ctx, src, n, strings.NewReader(body), int64(len(body))); err != nil {
			t.Fatal(err)
		}
	}
	// A key no run could have written is not copied.
	if err := s.PutForeign(ctx, "test/alice/src/back\\slash"); err != nil {
		t.Fatal(err)
	}
	got, err := s.Fork(ctx, src, dst)
	if err != nil {
		t.Fatal(err)
	}
	if got.Files != 3 || got.Cloned != 3 || got.Bytes != 9 || got.Packages {
		t.Errorf("forked %+v, want 3 files, 9 bytes, all server-side", got)
	}
	read := func(conv, name string) string {
		r, _, err := s.Open(ctx, conv, name)
		if err != nil {
			t.Fatalf("open %s of %s: %v", name, conv, err)
		}
		defer r.Close()
		b, _ := io.ReadAll(r)
		return string(b)
	}
	for n, body := range want {
		if got := read(dst, n); got != body {
			t.Errorf("fork's %s holds %q, want %q", n, got, body)
		}
	}
	if used, err := s.Usage(ctx, dst); err != nil || used != 9 {
		t.Errorf("fork uses %d, %v", used, err)
	}
	if _, err := s.Write(ctx, dst, "a.txt", strings.NewReader("fork"), 100, true); err != nil {
		t.Fatal(err)
	}
	if got := read(src, "a.txt"); got != "hello" {
		t.Errorf("a write to the fork changed the source: %q", got)
	}

	if _, err := s.Fork(ctx, src, dst); runbox.ErrorCode(err) != runbox.EConversationExists {
		t.Errorf("fork onto an existing conversation: %v", err)
	}
	if _, err := s.Fork(ctx, src, "../x"); runbox.ErrorCode(err) != runbox.EInvalid {
		t.Errorf("fork to an invalid key: %v", err)
	}
	// A cancelled fork leaves nothing.
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	if _, err := s.Fork(cctx, src, "~alice~gone"); err == nil {
		t.Error("a cancelled fork succeeded")
	}
	if ok, err := s.Exists(ctx, "~alice~gone"); err != nil || ok {
		t.Errorf("a failed fork left objects: %v, %v", ok, err)
	}
}

// TestState: a conversation's saved interpreter state is kept beside its
// files, never listed with them, and counts in its quota: an upload that
// would pass the quota with it is refused, the room for a new state is
// the quota less the files only, and the state goes with the
// conversation.
func TestState(t *testing.T) {
	ctx := context.Background()
	s := open(t, 100)
	const conv = "~alice~kept"
	if _, err := s.Write(ctx, conv, "a.txt", strings.NewReader(strings.Repeat("a", 20)), 100, false); err != nil {
		t.Fatal(err)
	}
	if room, err := s.StateRoom(ctx, conv); err != nil || room != 80 {
		t.Fatalf("room for state: %d, %v", room, err)
	}
	if _, err := s.PutState(ctx, conv, strings.NewReader(strings.Repeat("s", 81)), 80); runbox.ErrorCode(err) != runbox.EQuotaExceeded {
		t.Errorf("state past the room: %v", err)
	}
	if n, err := s.PutState(ctx, conv, strings.NewReader(strings.Repeat("s", 60)), 80); err != nil || n != 60 {
		t.Fatalf("put state: %d, %v", n, err)
	}
	if used, err := s.Usage(ctx, conv); err != nil || used != 80 {
		t.Errorf("usage with state: %d, %v", used, err)
	}
	if list, err := s.List(ctx, conv); err != nil || names(list) != "a.txt" {
		t.Errorf("list: %q, %v", names(list), err)
	}
	// 20 of files and 60 of state leave 20.
	tests := []struct {
		name, file string
		size       int
		code       string
	}{
		{"past the quota with the state", "b.txt", 21, runbox.EQuotaExceeded},
		{"within it", "b.txt", 20, ""},
	}
	for _, tt := range tests {
		_, err := s.Write(ctx, conv, tt.file, strings.NewReader(strings.Repeat("b", tt.size)), 100, false)
		if tt.code == "" && err != nil || tt.code != "" && runbox.ErrorCode(err) != tt.code {
			t.Errorf("%s: error %v, want code %q", tt.name, err, tt.code)
		}
	}
	// A state replaces the one before: its room leaves that one out.
	if room, err := s.StateRoom(ctx, conv); err != nil || room != 60 {
		t.Errorf("room for a new state: %d, %v", room, err)
	}
	if err := s.Remove(ctx, conv); err != nil {
		t.Fatal(err)
	}
	if _, err := s.OpenState(ctx, conv); !errors.Is(err, runbox.ErrFileNotFound) {
		t.Errorf("state after the conversation's removal: %v", err)
	}
	if used, err := s.ClientUsage(ctx, "alice"); err != nil || used != 0 {
		t.Errorf("alice uses %d, %v", used, err)
	}
}

// TestForkPastTheQuota: a source that takes more than a conversation's
// quota (objects count whole: S3 has no holes) is refused before anything
// is copied.
func TestForkPastTheQuota(t *testing.T) {
	ctx := context.Background()
	s := open(t, 1<<20)
	const src, dst = "~alice~big", "~alice~bigfork"
	for _, n := range []string{"a.bin", "b.bin"} {
		if _, err := s.Put(ctx, src, n, bytes.NewReader(make([]byte, 600<<10)), 600<<10); err != nil {
			t.Fatal(err)
		}
	}
	if got, err := s.Fork(ctx, src, dst); runbox.ErrorCode(err) != runbox.EQuotaExceeded {
		t.Fatalf("fork of 1.2 MiB into 1 MiB: %+v, %v", got, err)
	}
	if ok, err := s.Exists(ctx, dst); err != nil || ok {
		t.Errorf("a refused fork copied objects: %v, %v", ok, err)
	}
}
