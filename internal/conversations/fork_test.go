package conversations

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/runbox-dev/runbox"
	"github.com/runbox-dev/runbox/internal/agent"
	"github.com/runbox-dev/runbox/internal/auth"
	"github.com/runbox-dev/runbox/internal/clients"
	"github.com/runbox-dev/runbox/internal/files"
	"github.com/runbox-dev/runbox/internal/queue"
	"github.com/runbox-dev/runbox/internal/runs"
	"github.com/runbox-dev/runbox/internal/snapshot"
	"github.com/runbox-dev/runbox/internal/sparse/sparsetest"
	"github.com/runbox-dev/runbox/internal/store"
	"github.com/runbox-dev/runbox/internal/store/stream"
	"github.com/runbox-dev/runbox/internal/testenv"
)

type forkEnv struct {
	svc     *Service
	st      *store.Store
	folders *files.Folders
	keeper  *snapshot.Keeper
}

func newForkEnv(t *testing.T) forkEnv {
	t.Helper()
	_, url := testenv.Miniredis(t)
	rdb := testenv.Client(t, url)
	conn := store.NewConn(rdb)
	st := store.New(conn)
	log := slog.New(slog.DiscardHandler)
	hub := stream.NewHub(conn, st, log)
	t.Cleanup(func() { hub.Close() })
	folders, err := files.NewFolders(t.TempDir(), files.Options{UID: os.Getuid(), GID: os.Getgid(), Quota: 1 << 20, Mode: files.QuotaWalk})
	if err != nil {
		t.Fatal(err)
	}
	fs := files.NewHostStore(folders)
	rs := runs.NewService(st, hub, queue.NewScheduler(st, queue.NewClient(conn), log),
		runs.Limits{ClientStorage: fs.ClientUsage}, log)
	keeper := snapshot.NewKeeper(folders, st, []byte("secret"), log)
	return forkEnv{svc: NewService(fs, files.NewSigner([]byte("k"), "http://x", time.Hour), rs, st, keeper,
		Limits{MaxUpload: 1 << 20}), st: st, folders: folders, keeper: keeper}
}

func as(name string, tier clients.Tier) context.Context {
	return auth.WithClient(context.Background(), clients.Client{Name: name, Tier: tier})
}

func TestFork(t *testing.T) {
	env := newForkEnv(t)
	alice := as("alice", clients.Tier{})
	if _, err := env.svc.Upload(alice, "src", "data.csv", strings.NewReader("a,b\n"), false); err != nil {
		t.Fatal(err)
	}
	got, err := env.svc.Fork(alice, ForkRequest{ConversationID: "src", NewID: "mine"})
	if err != nil {
		t.Fatal(err)
	}
	if len(got.Conversations) != 1 || got.Conversations[0].ConversationID != "mine" || got.Files != 1 ||
		got.ForkedFrom != "src" || !got.PackagesForked || got.StateForked || got.Note == "" {
		t.Errorf("fork: %+v", got)
	}
	if list, err := env.svc.List(alice, "mine"); err != nil || len(list) != 1 || list[0].Name != "data.csv" {
		t.Errorf("fork's files: %+v, %v", list, err)
	}

	three, err := env.svc.Fork(alice, ForkRequest{ConversationID: "src", Count: 3})
	if err != nil || len(three.Conversations) != 3 {
		t.Fatalf("count 3: %+v, %v", three, err)
	}
	for _, c := range three.Conversations {
		if list, err := env.svc.List(alice, c.ConversationID); err != nil || len(list) != 1 {
			t.Errorf("fork %s: %+v, %v", c.ConversationID, list, err)
		}
	}

	tests := []struct {
		name string
		ctx  context.Context
		req  ForkRequest
		code string
	}{
		{"existing target", alice, ForkRequest{ConversationID: "src", NewID: "mine"}, runbox.EConversationExists},
		{"onto itself", alice, ForkRequest{ConversationID: "src", NewID: "src"}, runbox.EConversationExists},
		{"invalid target", alice, ForkRequest{ConversationID: "src", NewID: "../x"}, runbox.EInvalid},
		{"invalid source", alice, ForkRequest{ConversationID: "a/b"}, runbox.EInvalid},
		{"unknown source", alice, ForkRequest{ConversationID: "never"}, runbox.ENotFound},
		{"another client's", as("bob", clients.Tier{}), ForkRequest{ConversationID: "src"}, runbox.ENotFound},
		{"count 0 is 1", alice, ForkRequest{ConversationID: "src", Count: 0}, ""},
		{"count over 10", alice, ForkRequest{ConversationID: "src", Count: 11}, runbox.EInvalid},
		{"negative count", alice, ForkRequest{ConversationID: "src", Count: -1}, runbox.EInvalid},
		{"a name for several", alice, ForkRequest{ConversationID: "src", NewID: "x", Count: 2}, runbox.EInvalid},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := env.svc.Fork(tt.ctx, tt.req)
			if runbox.ErrorCode(err) != tt.code && !(tt.code == "" && err == nil) {
				t.Errorf("error %v, want %q", err, tt.code)
			}
		})
	}
	if env.folders.Exists("~bob~src") {
		t.Error("bob's refused fork made a folder")
	}
}

// TestForkLimits: forks that would pass the client's storage or new
// conversations an hour are refused before anything is copied.
func TestForkLimits(t *testing.T) {
	env := newForkEnv(t)
	carol := as("carol", clients.Tier{NewConversationsPerHour: 3, StorageBytes: 64 << 10})
	if _, err := env.svc.Upload(carol, "src", "data.bin", strings.NewReader(strings.Repeat("x", 12<<10)), false); err != nil {
		t.Fatal(err)
	}
	count := func() int {
		entries, _ := os.ReadDir(env.folders.Root())
		return len(entries)
	}
	before := count()
	// 12 KB each: four forks would pass 64 KB with the source's.
	if _, err := env.svc.Fork(carol, ForkRequest{ConversationID: "src", Count: 5}); runbox.ErrorCode(err) != runbox.EQuotaExceeded {
		t.Errorf("forks past the storage: %v", err)
	}
	// The source was one new conversation of 3: three more pass the hour.
	if _, err := env.svc.Fork(carol, ForkRequest{ConversationID: "src", Count: 3}); runbox.ErrorCode(err) != runbox.ERateLimited {
		t.Errorf("forks past the hour: %v", err)
	}
	if count() != before {
		t.Errorf("refused forks made folders: %d, want %d", count(), before)
	}
	if _, err := env.svc.Fork(carol, ForkRequest{ConversationID: "src", Count: 2}); err != nil {
		t.Errorf("forks within the limits: %v", err)
	}
	if _, err := env.svc.Fork(carol, ForkRequest{ConversationID: "src"}); runbox.ErrorCode(err) != runbox.ERateLimited {
		t.Errorf("a fork past the hour: %v", err)
	}
}

// TestForkBusy: a conversation with a run queued or running is not
// forked.
func TestForkBusy(t *testing.T) {
	env := newForkEnv(t)
	alice := as("alice", clients.Tier{})
	key, _ := runs.ConversationKey(alice, "src")
	if _, err := env.svc.Upload(alice, "src", "a.txt", strings.NewReader("x"), false); err != nil {
		t.Fatal(err)
	}
	_, _, err := env.st.CreateRun(alice, runbox.NewRun{
		Run:  runbox.Run{ID: "run_0123456789abcdef01234567", ConversationID: key, Language: "bash", Status: runbox.StatusQueued, CreatedAt: time.Now()},
		Spec: runbox.Spec{ConversationID: key, Language: "bash", Code: "sleep 60", TimeoutSeconds: 60}, MaxWaiting: 4,
		Client: "alice",
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := env.svc.Fork(alice, ForkRequest{ConversationID: "src", NewID: "f"}); runbox.ErrorCode(err) != runbox.EBusy {
		t.Errorf("fork of a busy conversation: %v", err)
	}
	if env.folders.Exists("~alice~f") {
		t.Error("a refused fork made its folder")
	}
	// Its id was not kept: it may be used once the source is at rest.
	if taken, _ := env.st.ClaimConversations(alice, []string{"~alice~f"}, time.Minute); taken != "" {
		t.Error("a refused fork kept its id")
	}
	if _, err := os.Stat(filepath.Join(env.folders.Path(key), "a.txt")); err != nil {
		t.Errorf("the source lost its file: %v", err)
	}
}

// interp is a kept interpreter whose state is bytes.
type interp struct{ state, restored []byte }

func (i *interp) SaveState(_ context.Context, w io.Writer) (agent.StateSaved, error) {
	_, err := w.Write(i.state)
	return agent.StateSaved{Saved: 1}, err
}

func (i *interp) RestoreState(_ context.Context, r io.Reader, _ bool) (agent.StateRestored, error) {
	var err error
	i.restored, err = io.ReadAll(r)
	return agent.StateRestored{Restored: 1}, err
}

// TestForkState: a fork of a conversation whose kept state is saved gets
// it, sealed for itself and counted in its size and quota; its first
// interpreter restores it, and so does the source's next one.
func TestForkState(t *testing.T) {
	env := newForkEnv(t)
	alice := as("alice", clients.Tier{StorageBytes: 1 << 20})
	if _, err := env.svc.Upload(alice, "src", "data.csv", strings.NewReader("a,b\n"), false); err != nil {
		t.Fatal(err)
	}
	src, _ := runs.ConversationKey(alice, "src")
	r, err := env.keeper.Resume(alice, src, &interp{})
	if err != nil {
		t.Fatal(err)
	}
	state := []byte(strings.Repeat("df = pandas.DataFrame() ", 4000))
	if _, err := env.keeper.Pause(alice, src, r.Gen, &interp{state: state}); err != nil {
		t.Fatal(err)
	}
	got, err := env.svc.Fork(alice, ForkRequest{ConversationID: "src", NewID: "mine"})
	if err != nil {
		t.Fatal(err)
	}
	if !got.StateForked || got.SizeBytes < int64(len(state)) || got.Note != "" {
		t.Errorf("fork: %+v", got)
	}
	fork, _ := runs.ConversationKey(alice, "mine")
	if used, _, _ := env.folders.Usage(fork); used < int64(len(state)) {
		t.Errorf("the fork uses %d bytes, its state alone %d", used, len(state))
	}
	for _, conv := range []string{fork, src} {
		in := &interp{}
		if r, err := env.keeper.Resume(alice, conv, in); err != nil || !r.Restored || string(in.restored) != string(state) {
			t.Errorf("%s: resumed %+v, %v", conv, r, err)
		}
	}
	// The client's storage counts the state.
	dave := as("dave", clients.Tier{StorageBytes: 250 << 10})
	if _, err := env.svc.Upload(dave, "src", "a.txt", strings.NewReader("x"), false); err != nil {
		t.Fatal(err)
	}
	dsrc, _ := runs.ConversationKey(dave, "src")
	dr, _ := env.keeper.Resume(dave, dsrc, &interp{})
	if _, err := env.keeper.Pause(dave, dsrc, dr.Gen, &interp{state: state}); err != nil {
		t.Fatal(err)
	}
	// 96 KB of state: the source and two forks pass 250 KB, one does not.
	if _, err := env.svc.Fork(dave, ForkRequest{ConversationID: "src", Count: 2}); runbox.ErrorCode(err) != runbox.EQuotaExceeded {
		t.Errorf("forks whose state passes the storage: %v", err)
	}
	if one, err := env.svc.Fork(dave, ForkRequest{ConversationID: "src"}); err != nil || !one.StateForked {
		t.Errorf("a fork within the storage: %+v, %v", one, err)
	}
}

// TestForkSparse: six sparse files of a mebibyte each, 8 KiB of data
// apiece, in a conversation whose quota is a mebibyte (walk mode, which
// counts them whole): forking it twice is refused with quota_exceeded
// before anything is written — by the service, and by the store where
// the service does not know the quota — and the ids are freed. A sparse
// file within the quota is forked with its holes kept.
func TestForkSparse(t *testing.T) {
	for _, quota := range []int64{0, 1 << 20} {
		t.Run(fmt.Sprintf("service quota %d", quota), func(t *testing.T) {
			env := newForkEnv(t)
			env.svc.limits.Quota = quota
			alice := as("alice", clients.Tier{})
			key, _ := runs.ConversationKey(alice, "src")
			dir, err := env.folders.Ensure(key)
			if err != nil {
				t.Fatal(err)
			}
			for i := range 6 {
				sparsetest.File(t, filepath.Join(dir, fmt.Sprintf("f%d", i)), 1<<20-4096)
			}
			before, _ := env.folders.Conversations()
			if _, err := env.svc.Fork(alice, ForkRequest{ConversationID: "src", Count: 2}); runbox.ErrorCode(err) != runbox.EQuotaExceeded {
				t.Fatalf("fork of 6 MiB of sparse files into 1 MiB: %v", err)
			}
			if after, _ := env.folders.Conversations(); len(after) != len(before) {
				t.Errorf("a refused fork made folders: %v", after)
			}
			if entries, _ := os.ReadDir(filepath.Join(env.folders.Root(), ".forks")); len(entries) != 0 {
				t.Errorf("a refused fork made staging folders: %v", entries)
			}

			for i := range 5 {
				os.Remove(filepath.Join(dir, fmt.Sprintf("f%d", i)))
			}
			got, err := env.svc.Fork(alice, ForkRequest{ConversationID: "src", Count: 2})
			if err != nil {
				t.Fatalf("fork of a sparse file within the quota: %v", err)
			}
			for _, c := range got.Conversations {
				fork, _ := runs.ConversationKey(alice, c.ConversationID)
				sparsetest.Check(t, filepath.Join(env.folders.Path(fork), "f5"), 1<<20-4096)
			}
		})
	}
}
