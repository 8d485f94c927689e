package mcp

import (
	"context"
	"encoding/json"
	"log/slog"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	mcpsdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/runbox-dev/runbox"
	"github.com/runbox-dev/runbox/internal/conversations"
	"github.com/runbox-dev/runbox/internal/files"
	"github.com/runbox-dev/runbox/internal/queue"
	"github.com/runbox-dev/runbox/internal/runs"
	"github.com/runbox-dev/runbox/internal/store"
	"github.com/runbox-dev/runbox/internal/store/stream"
	"github.com/runbox-dev/runbox/internal/testenv"
)

// fixture is the MCP server over an in-memory transport, on miniredis,
// where finish plays the executor.
type fixture struct {
	cs    *mcpsdk.ClientSession
	store *store.Store
	srv   *Server
}

func newFixture(t *testing.T, opts *mcpsdk.ClientOptions) *fixture {
	t.Helper()
	_, url := testenv.Miniredis(t)
	rdb := testenv.Client(t, url)
	conn := store.NewConn(rdb)
	st := store.New(conn)
	log := slog.New(slog.DiscardHandler)
	hub := stream.NewHub(conn, st, log)
	t.Cleanup(func() { hub.Close() })
	q := queue.NewClient(conn)
	ctx := context.Background()
	st.Heartbeat(ctx, runbox.ExecutorInfo{ID: "fake", Runners: []runbox.Runner{
		{Language: "bash", Image: "runner-bash"}, {Language: "python", Image: "runner-python"},
	}}, time.Hour)
	svc := runs.NewService(st, hub, queue.NewScheduler(st, q, log), runs.Limits{MaxCodeBytes: 1000, MaxTimeoutSeconds: 60, MaxStdinBytes: 100, MaxWaiting: 4}, log)
	folders, err := files.NewFolders(t.TempDir(), files.Options{UID: os.Getuid(), GID: os.Getgid(), Quota: 1 << 20, Mode: files.QuotaWalk})
	if err != nil {
		t.Fatal(err)
	}
	signer := files.NewSigner([]byte("0123456789abcdef0123456789abcdef"), "http://test", time.Hour)
	convs := conversations.NewService(files.NewHostStore(folders), signer, svc, st, nil, conversations.Limits{MaxUpload: 1000, MaxRead: 1000, MaxInlineImages: 4, MaxInlineImageBytes: 1000})
	srv := New(context.Background(), Options{Runs: svc, Conversations: convs, Log: log})

	f := &fixture{store: st, srv: srv}

	ct, stt := mcpsdk.NewInMemoryTransports()
	if _, err := srv.SDK().Connect(ctx, stt, nil); err != nil {
		t.Fatal(err)
	}
	cs, err := mcpsdk.NewClient(&mcpsdk.Implementation{Name: "test", Version: "1"}, opts).Connect(ctx, ct, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cs.Close() })
	f.cs = cs
	return f
}

// finish plays the executor for the run a call is waiting on.
func (f *fixture) finish(t *testing.T, cid string) {
	t.Helper()
	ctx := context.Background()
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		runs, _ := f.store.RecentRuns(ctx, "", cid, 10)
		for _, r := range runs {
			id := r.ID
			if ok, _ := f.store.Claim(ctx, id, "fake", time.Minute); !ok {
				continue
			}
			f.store.Append(ctx, id, runbox.Event{Type: runbox.EventStdout, Data: "one\n"})
			f.store.Append(ctx, id, runbox.Event{Type: runbox.EventStderr, Data: "two\n"})
			f.store.Finish(ctx, id, runbox.Ending{From: []runbox.Status{runbox.StatusRunning}, Lease: runbox.LeaseDelete, Status: runbox.StatusSucceeded,
				Result: &runbox.Result{Success: true, Stdout: "one\n", Stderr: "two\n", RunID: id, ConversationID: cid}, Conversation: cid})
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Error("no run to finish")
}

func call(t *testing.T, cs *mcpsdk.ClientSession, params *mcpsdk.CallToolParams) (*mcpsdk.CallToolResult, map[string]any) {
	t.Helper()
	res, err := cs.CallTool(context.Background(), params)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	b, _ := json.Marshal(res.StructuredContent)
	json.Unmarshal(b, &m)
	return res, m
}

func TestRunCodeAndAliases(t *testing.T) {
	var mu sync.Mutex
	progress := map[any]string{} // by progress token
	f := newFixture(t, &mcpsdk.ClientOptions{ProgressNotificationHandler: func(_ context.Context, r *mcpsdk.ProgressNotificationClientRequest) {
		mu.Lock()
		progress[r.Params.ProgressToken] += r.Params.Message
		mu.Unlock()
	}})
	for _, name := range []string{"run_code", "sandbox.run_code"} {
		t.Run(name, func(t *testing.T) {
			cid := strings.ReplaceAll(name, ".", "-")
			params := &mcpsdk.CallToolParams{Name: name, Arguments: map[string]any{"language": "python", "code": "print(1)", "session_id": cid}}
			params.SetProgressToken(name)
			go f.finish(t, cid)
			res, m := call(t, f.cs, params)
			if res.IsError || m["success"] != true || m["conversationId"] != cid {
				t.Fatalf("result %v %v", res.IsError, m)
			}
			if !strings.Contains(res.Content[0].(*mcpsdk.TextContent).Text, `"stdout":"one\n"`) {
				t.Errorf("text content %v", res.Content[0])
			}
			// The client may handle notifications after the result.
			deadline := time.Now().Add(5 * time.Second)
			for {
				mu.Lock()
				got := progress[name]
				mu.Unlock()
				if got == "one\ntwo\n" {
					break
				}
				if time.Now().After(deadline) {
					t.Fatalf("progress %q", got)
				}
				time.Sleep(10 * time.Millisecond)
			}
		})
	}
}

func TestToolErrors(t *testing.T) {
	f := newFixture(t, nil)
	tests := []struct {
		args map[string]any
		code string
	}{
		{map[string]any{"language": "cobol", "code": "x"}, runbox.EUnknownLanguage},
		{map[string]any{"language": "python", "code": ""}, runbox.EInvalid},
		{map[string]any{"language": "python", "code": "x", "conversationId": "a b"}, runbox.EInvalid},
		{map[string]any{"language": "python", "code": strings.Repeat("x", 1001)}, runbox.ETooLarge},
	}
	for _, tt := range tests {
		res, m := call(t, f.cs, &mcpsdk.CallToolParams{Name: "run_code", Arguments: tt.args})
		if !res.IsError || m["error"] != tt.code || m["message"] == "" {
			t.Errorf("%v: %v %v, want %s", tt.args, res.IsError, m, tt.code)
		}
	}
}

func TestListRunners(t *testing.T) {
	f := newFixture(t, nil)
	for _, name := range []string{"list_runners", "sandbox.list_runners"} {
		res, m := call(t, f.cs, &mcpsdk.CallToolParams{Name: name})
		langs, _ := m["languages"].([]any)
		if res.IsError || len(langs) != 2 {
			t.Errorf("%s: %v", name, m)
		}
	}
	tools, err := f.cs.ListTools(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, tool := range tools.Tools {
		if _, alias := f.srv.tools.tool(tool.Name); alias || strings.HasPrefix(tool.Name, "sandbox.") {
			t.Errorf("alias %s is listed", tool.Name)
		}
	}
}
