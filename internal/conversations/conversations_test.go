package conversations

import (
	"context"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/runbox-dev/runbox"
	"github.com/runbox-dev/runbox/internal/auth"
	"github.com/runbox-dev/runbox/internal/clients"
	"github.com/runbox-dev/runbox/internal/files"
	"github.com/runbox-dev/runbox/internal/queue"
	"github.com/runbox-dev/runbox/internal/runs"
	"github.com/runbox-dev/runbox/internal/store"
	"github.com/runbox-dev/runbox/internal/store/stream"
	"github.com/runbox-dev/runbox/internal/testenv"
)

// TestCloseWaitsForItsRuns: a conversation whose cancelled run has not
// ended (its executor still saving its files, which would put back what
// the close removes) keeps its files and is busy; once the run has
// ended, it closes.
func TestCloseWaitsForItsRuns(t *testing.T) {
	ctx := auth.WithClient(context.Background(), clients.Client{Name: "alice"})
	rdb := testenv.Client(t, testenv.Redis(t))
	conn := store.NewConn(rdb)
	st := store.New(conn)
	log := slog.New(slog.DiscardHandler)
	hub := stream.NewHub(conn, st, log)
	t.Cleanup(func() { hub.Close() })
	rs := runs.NewService(st, hub, queue.NewScheduler(st, queue.NewClient(conn), log), runs.Limits{}, log)
	root := t.TempDir()
	folders, err := files.NewFolders(root, files.Options{UID: os.Getuid(), GID: os.Getgid(), Quota: 1 << 20, Mode: files.QuotaWalk})
	if err != nil {
		t.Fatal(err)
	}
	svc := NewService(files.NewHostStore(folders), nil, rs, st, nil, Limits{})
	svc.closeWait = 100 * time.Millisecond

	key, err := runs.ConversationKey(ctx, "c")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := folders.Write(key, "out.txt", strings.NewReader("x"), 10, true); err != nil {
		t.Fatal(err)
	}
	_, _, err = st.CreateRun(ctx, runbox.NewRun{
		Run:  runbox.Run{ID: "run_0123456789abcdef01234567", ConversationID: key, Language: "bash", Status: runbox.StatusQueued, CreatedAt: time.Now()},
		Spec: runbox.Spec{ConversationID: key, Language: "bash", Code: "sleep 60", TimeoutSeconds: 60}, MaxWaiting: 4,
		Client: "alice",
	})
	if err != nil {
		t.Fatal(err)
	}
	if c, err := st.ClaimFor(ctx, "run_0123456789abcdef01234567", "ex", time.Hour, 0); err != nil || !c.OK {
		t.Fatalf("claim: %+v, %v", c, err)
	}
	// Its executor never ends it.
	if err := svc.Close(ctx, "c"); runbox.ErrorCode(err) != runbox.EBusy {
		t.Fatalf("close with a run still ending: %v; want busy", err)
	}
	if _, err := os.Stat(filepath.Join(folders.Path(key), "out.txt")); err != nil {
		t.Fatalf("files removed while a run was still ending: %v", err)
	}
	if _, err := st.Finish(ctx, "run_0123456789abcdef01234567", runbox.Ending{From: []runbox.Status{runbox.StatusRunning}, Lease: runbox.LeaseDelete,
		Status: runbox.StatusCancelled, Result: &runbox.Result{}, Conversation: key}); err != nil {
		t.Fatal(err)
	}
	if err := svc.Close(ctx, "c"); err != nil {
		t.Fatalf("close once its run ended: %v", err)
	}
	if _, err := os.Stat(filepath.Join(folders.Path(key), "out.txt")); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("files after the close: %v", err)
	}
}
