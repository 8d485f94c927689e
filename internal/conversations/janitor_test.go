package conversations

import (
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/runbox-dev/runbox"
	"github.com/runbox-dev/runbox/internal/files"
	"github.com/runbox-dev/runbox/internal/lifecycle"
	"github.com/runbox-dev/runbox/internal/store"
	"github.com/runbox-dev/runbox/internal/testenv"
)

func TestJanitorRetention(t *testing.T) {
	root := t.TempDir()
	folders, err := files.NewFolders(root, files.Options{UID: os.Getuid(), GID: os.Getgid(), Quota: 1 << 20, Mode: files.QuotaWalk})
	if err != nil {
		t.Fatal(err)
	}
	_, url := testenv.Miniredis(t)
	st := store.New(store.NewConn(testenv.Client(t, url)))
	ctx := context.Background()
	for _, cid := range []string{"old", "old-busy", "fresh"} {
		if _, err := folders.Ensure(cid); err != nil {
			t.Fatal(err)
		}
	}
	long := time.Now().Add(-48 * time.Hour)
	os.Chtimes(filepath.Join(root, "old"), long, long)
	os.Chtimes(filepath.Join(root, "old-busy"), long, long)
	// old-busy has a run queued: it is never swept.
	st.CreateRun(ctx, runbox.NewRun{Run: runbox.Run{ID: "r1", ConversationID: "old-busy", CreatedAt: time.Now()}, MaxWaiting: 1})

	NewJanitor(folders, st, time.Minute, 24*time.Hour, lifecycle.Periodic(clockwork.NewRealClock()), slog.New(slog.DiscardHandler)).Sweep(ctx)
	for cid, want := range map[string]bool{"old": false, "old-busy": true, "fresh": true} {
		_, err := os.Stat(filepath.Join(root, cid))
		if exists := err == nil; exists != want {
			t.Errorf("%s exists = %v, want %v", cid, exists, want)
		}
	}
	// Without retention, files stay.
	os.Chtimes(filepath.Join(root, "fresh"), long, long)
	NewJanitor(folders, st, time.Minute, 0, lifecycle.Periodic(clockwork.NewRealClock()), slog.New(slog.DiscardHandler)).Sweep(ctx)
	if _, err := os.Stat(filepath.Join(root, "fresh")); err != nil {
		t.Errorf("without retention, a conversation was removed: %v", err)
	}
}

// TestExpiry: a remote store's conversations go after retention without
// use; a busy one, or one used since, stays.
func TestExpiry(t *testing.T) {
	ctx := context.Background()
	folders, err := files.NewFolders(t.TempDir(), files.Options{UID: os.Getuid(), GID: os.Getgid(), Quota: 1 << 20, Mode: files.QuotaWalk})
	if err != nil {
		t.Fatal(err)
	}
	_, url := testenv.Miniredis(t)
	st := store.New(store.NewConn(testenv.Client(t, url)))
	fs := files.NewHostStore(folders) // any FileStore: the expiry only removes
	clock := clockwork.NewFakeClockAt(time.Unix(1_000_000, 0))
	for _, cid := range []string{"old", "old-busy", "fresh"} {
		if _, err := fs.Write(ctx, cid, "f", strings.NewReader("x"), 10, false); err != nil {
			t.Fatal(err)
		}
		at := clock.Now().Add(-2 * time.Hour)
		if cid == "fresh" {
			at = clock.Now()
		}
		if _, _, err := st.FilesChanged(ctx, cid, -1, at); err != nil {
			t.Fatal(err)
		}
	}
	st.CreateRun(ctx, runbox.NewRun{Run: runbox.Run{ID: "r1", ConversationID: "old-busy", CreatedAt: time.Now()}, MaxWaiting: 1})
	NewExpiry(fs, st, time.Hour, clock, lifecycle.Periodic(clock), slog.New(slog.DiscardHandler)).Sweep(ctx)
	for cid, want := range map[string]bool{"old": false, "old-busy": true, "fresh": true} {
		if ok, _ := fs.Exists(ctx, cid); ok != want {
			t.Errorf("%s exists = %v, want %v", cid, ok, want)
		}
	}
}
