package mcp_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	mcpsdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/runbox-dev/runbox"
	"github.com/runbox-dev/runbox/internal/auth"
	"github.com/runbox-dev/runbox/internal/clients"
	"github.com/runbox-dev/runbox/internal/commands"
	"github.com/runbox-dev/runbox/internal/conversations"
	"github.com/runbox-dev/runbox/internal/files"
	"github.com/runbox-dev/runbox/internal/gitexport"
	"github.com/runbox-dev/runbox/internal/link"
	"github.com/runbox-dev/runbox/internal/mcp"
	"github.com/runbox-dev/runbox/internal/preview"
	"github.com/runbox-dev/runbox/internal/projects"
	"github.com/runbox-dev/runbox/internal/queue"
	"github.com/runbox-dev/runbox/internal/runs"
	"github.com/runbox-dev/runbox/internal/sessions"
	"github.com/runbox-dev/runbox/internal/store"
	"github.com/runbox-dev/runbox/internal/store/stream"
	"github.com/runbox-dev/runbox/internal/testenv"
)

var update = flag.Bool("update", false, "rewrite testdata/tools.golden.json")

// golden is what clients see of the tools: the list, which tools are
// open-world where clients may ask for network, and the answers of calls
// in every family's dialect.
type golden struct {
	Tools               []*mcpsdk.Tool `json:"tools"`
	OpenWorldWithEgress []string       `json:"open_world_with_egress"`
	Calls               []goldenCall   `json:"calls"`
}

type goldenCall struct {
	Client    string          `json:"client,omitempty"`
	Tool      string          `json:"tool"`
	Arguments map[string]any  `json:"arguments,omitempty"`
	Result    json.RawMessage `json:"result"`
}

// TestToolsGolden pins every tool as clients see it — names,
// descriptions, input and output schemas, annotations — and answers and
// errors of each family (core, PRD, aliases, commands, preview, projects,
// git), their codes, shapes and dialects included, against
// testdata/tools.golden.json (go test -run TestToolsGolden -update
// rewrites it).
func TestToolsGolden(t *testing.T) {
	h := newAllFamilies(t, false)
	got := golden{Tools: h.tools(t)}
	for _, tool := range newAllFamilies(t, true).tools(t) {
		if *tool.Annotations.OpenWorldHint {
			got.OpenWorldWithEgress = append(got.OpenWorldWithEgress, tool.Name)
		}
	}
	for _, c := range goldenCalls {
		got.Calls = append(got.Calls, h.call(t, c))
	}
	b, err := json.MarshalIndent(got, "", "  ")
	if err != nil {
		t.Fatal(err)
	}
	b = append(b, '\n')
	path := filepath.Join("testdata", "tools.golden.json")
	if *update {
		if err := os.MkdirAll("testdata", 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, b, 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(want, b) {
		diffAt := 0
		for diffAt < len(want) && diffAt < len(b) && want[diffAt] == b[diffAt] {
			diffAt++
		}
		from := max(0, diffAt-300)
		t.Errorf("tools differ from %s at byte %d:\nwant …%s…\n got …%s…", path, diffAt,
			want[from:min(len(want), diffAt+300)], b[from:min(len(b), diffAt+300)])
	}
}

// A PNG of one pixel, and a text file larger than the 100 bytes read
// inline.
const (
	dotPNG = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5ErkJggg=="
	big    = "MDEyMzQ1Njc4OTAxMjM0NTY3ODkwMTIzNDU2Nzg5MDEyMzQ1Njc4OTAxMjM0NTY3ODkwMTIzNDU2Nzg5MDEyMzQ1Njc4OTAxMjM0NTY3ODkwMTIzNDU2Nzg5MDEyMzQ1Njc4OTAxMjM0NTY3ODkwMTIzNDU2Nzg5Cg=="
)

// goldenCalls are answered in order: the limited client's first call
// takes its one call a minute, and every later one is refused, in the
// dialect of the tool called.
var goldenCalls = []goldenCall{
	// Core: files.
	{Tool: "upload_file", Arguments: map[string]any{"conversationId": "golden", "filename": "a.txt", "content_base64": "aGVsbG8K"}},
	{Tool: "upload_file", Arguments: map[string]any{"session_id": "golden", "filename": "big.txt", "content_base64": big}},
	{Tool: "upload_file", Arguments: map[string]any{"conversationId": "golden", "filename": "b.txt", "content_base64": "%%%"}},
	{Tool: "upload_file", Arguments: map[string]any{"conversationId": "golden", "filename": "../b.txt", "content_base64": "eA=="}},
	{Tool: "upload_file", Arguments: map[string]any{"conversationId": "golden", "filename": "dot.png", "content_base64": dotPNG}},
	{Tool: "list_files", Arguments: map[string]any{"conversationId": "golden"}},
	{Tool: "read_file", Arguments: map[string]any{"conversationId": "golden", "name": "a.txt"}},
	{Tool: "read_file", Arguments: map[string]any{"conversationId": "golden", "path": "/data/big.txt"}},
	{Tool: "read_file", Arguments: map[string]any{"conversationId": "golden", "name": "none.txt"}},
	{Tool: "read_file", Arguments: map[string]any{"conversationId": "golden", "name": "dot.png"}},
	{Tool: "close_session", Arguments: map[string]any{"conversationId": "never-was"}},
	// Core: runs.
	{Tool: "run_code", Arguments: map[string]any{"language": "python", "code": "print(1)", "conversationId": "golden"}},
	{Tool: "run_code", Arguments: map[string]any{"language": "cobol", "code": "x"}},
	{Tool: "run_code", Arguments: map[string]any{"language": "python"}},
	{Tool: "run_code", Arguments: map[string]any{"language": "python", "code": "x", "conversationId": "a b"}},
	{Tool: "start_run", Arguments: map[string]any{"language": "python", "code": ""}},
	{Tool: "get_run", Arguments: map[string]any{"run_id": "run_000000000000000000000000"}},
	{Tool: "cancel_run", Arguments: map[string]any{"run_id": "run_000000000000000000000000"}},
	{Tool: "list_runs", Arguments: map[string]any{"conversationId": "a b"}},
	{Tool: "list_runners"},
	{Tool: "send_stdin", Arguments: map[string]any{}},
	{Tool: "send_stdin", Arguments: map[string]any{"run_id": "run_000000000000000000000000", "execution_id": "x"}},
	{Tool: "send_stdin", Arguments: map[string]any{"run_id": "run_000000000000000000000000", "data": "x"}},
	{Tool: "send_stdin", Arguments: map[string]any{"execution_id": "exec_nope", "input_data": "x"}},
	// The PRD's tools.
	{Tool: "run_python", Arguments: map[string]any{"session_id": "golden", "code": "print(1)"}},
	{Tool: "run_python", Arguments: map[string]any{"session_id": "golden", "code": ""}},
	{Tool: "read_artifact", Arguments: map[string]any{"session_id": "golden", "path": "/mnt/data/a.txt"}},
	{Tool: "read_artifact", Arguments: map[string]any{"session_id": "golden", "path": "/mnt/data/big.txt"}},
	{Tool: "read_artifact", Arguments: map[string]any{"session_id": "golden", "path": "/mnt/data/none.txt"}},
	{Tool: "read_artifact", Arguments: map[string]any{"session_id": "golden", "path": "/mnt/data/dot.png"}},
	{Tool: "read_artifact", Arguments: map[string]any{"session_id": "", "path": "/mnt/data/a.txt"}},
	{Tool: "list_artifacts", Arguments: map[string]any{"session_id": "golden"}},
	{Tool: "list_artifacts", Arguments: map[string]any{"session_id": "a b"}},
	// Aliases.
	{Tool: "sandbox.list_runners"},
	{Tool: "sandbox.run_code", Arguments: map[string]any{"language": "cobol", "code": "x"}},
	// The streaming sandbox server's commands.
	{Tool: "execute_code", Arguments: map[string]any{"command": ""}},
	{Tool: "execute_code_async", Arguments: map[string]any{"command": "true", "working_directory": "/etc"}},
	{Tool: "get_execution_output", Arguments: map[string]any{"execution_id": "exec_nope"}},
	{Tool: "get_execution_status", Arguments: map[string]any{"execution_id": "exec_nope"}},
	{Tool: "cancel_execution", Arguments: map[string]any{"execution_id": "exec_nope"}},
	{Tool: "list_executions"},
	// Previews.
	{Tool: "get_preview_url", Arguments: map[string]any{"conversationId": "golden", "port": 0}},
	{Tool: "get_preview_url", Arguments: map[string]any{"conversationId": "golden", "port": 8080}},
	// The gateway's project tools.
	{Tool: "create_sandbox_for_project", Arguments: map[string]any{"project_name": "bad name!", "template": "next"}},
	{Tool: "create_sandbox_for_project", Arguments: map[string]any{"project_name": "x", "template": "next"}},
	{Tool: "create_sandbox_for_project", Arguments: map[string]any{"project_name": "x", "template": "next", "initial_files": map[string]any{"../a.js": "1"}}},
	{Tool: "write_files_to_sandbox", Arguments: map[string]any{"sandbox_id": "3b241101-e2bb-4255-8caf-4136c566a962", "files": map[string]any{"a.js": "1"}}},
	{Tool: "get_sandbox_output", Arguments: map[string]any{"sandbox_id": "3b241101-e2bb-4255-8caf-4136c566a962", "output_type": "console_log"}},
	// The gateway's git tools.
	{Tool: gitexport.ToolRead, Arguments: map[string]any{"repo_id": "nope", "file_path": "a.txt"}},
	{Tool: gitexport.ToolRead, Arguments: map[string]any{"repo_id": "reports", "file_path": "../a.txt"}},
	{Tool: gitexport.ToolRead, Arguments: map[string]any{"repo_id": "reports", "file_path": "a.txt", "branch": "other"}},
	{Tool: gitexport.ToolCommit, Arguments: map[string]any{"repo_id": "reports", "branch": "agent/x", "commit_message": ""}},
	{Tool: gitexport.ToolCommit, Arguments: map[string]any{"repo_id": "reports", "branch": "agent/x", "commit_message": "m",
		"conversationId": "golden", "paths": []any{"none.txt"}}},
	// A limited client: one call a minute, then every tool's refusal.
	{Client: "limited", Tool: "list_runners"},
	{Client: "limited", Tool: "run_code", Arguments: map[string]any{"language": "python", "code": "x"}},
	{Client: "limited", Tool: "sandbox.run_code", Arguments: map[string]any{"language": "python", "code": "x"}},
	{Client: "limited", Tool: "read_artifact", Arguments: map[string]any{"session_id": "golden", "path": "/mnt/data/a.txt"}},
	{Client: "limited", Tool: "execute_code", Arguments: map[string]any{"command": "true"}},
	{Client: "limited", Tool: "get_preview_url", Arguments: map[string]any{"conversationId": "golden", "port": 8080}},
	{Client: "limited", Tool: "get_sandbox_output", Arguments: map[string]any{"sandbox_id": "3b241101-e2bb-4255-8caf-4136c566a962", "output_type": "console_log"}},
	{Client: "limited", Tool: gitexport.ToolRead, Arguments: map[string]any{"repo_id": "reports", "file_path": "a.txt"}},
	{Client: "limited", Tool: "no_such_tool"},
}

// allFamilies is the MCP server with every family's tools, over
// in-memory transports, on miniredis, where finish plays the executor.
type allFamilies struct {
	store   *store.Store
	clients map[string]*mcpsdk.ClientSession
}

func newAllFamilies(t *testing.T, egress bool) *allFamilies {
	t.Helper()
	ctx := context.Background()
	_, url := testenv.Miniredis(t)
	rdb := testenv.Client(t, url)
	conn := store.NewConn(rdb)
	st := store.New(conn)
	log := slog.New(slog.DiscardHandler)
	hub := stream.NewHub(conn, st, log)
	t.Cleanup(func() { hub.Close() })
	st.Heartbeat(ctx, runbox.ExecutorInfo{ID: "fake", Runners: []runbox.Runner{
		{Language: "bash", Image: "runner-bash"}, {Language: "python", Image: "runner-python"},
	}}, time.Hour)
	svc := runs.NewService(st, hub, queue.NewScheduler(st, queue.NewClient(conn), log), runs.Limits{MaxCodeBytes: 1000,
		MaxTimeoutSeconds: 60, MaxStdinBytes: 100, MaxWaiting: 4, EgressReachable: egress}, log)
	folders, err := files.NewFolders(t.TempDir(), files.Options{UID: os.Getuid(), GID: os.Getgid(), Quota: 1 << 20, Mode: files.QuotaWalk})
	if err != nil {
		t.Fatal(err)
	}
	fileStore := files.NewHostStore(folders)
	signer := files.NewSigner([]byte("0123456789abcdef0123456789abcdef"), "http://test", time.Hour)
	convs := conversations.NewService(fileStore, signer, svc, st, nil, conversations.Limits{MaxUpload: 1000, MaxRead: 100,
		MaxInlineImages: 4, MaxInlineImageBytes: 1000})

	mcpSessions := sessions.New(st, time.Hour, clockwork.NewRealClock(), log)
	executions := commands.New(svc, convs, st, mcpSessions, commands.Limits{TimeoutSeconds: 60, PerSession: 2,
		Total: 4, MaxCommandBytes: 1000}, log)
	srv := mcp.New(ctx, mcp.Options{Runs: svc, Conversations: convs, Executions: executions, Sessions: mcpSessions, Log: log})
	commands.Register(srv, executions)
	domain, err := preview.ParseDomain("preview.test", "http")
	if err != nil {
		t.Fatal(err)
	}
	previews := preview.NewService(preview.Options{Key: preview.Key([]byte("0123456789abcdef0123456789abcdef")),
		Domain: domain, TTL: time.Hour, Store: st, Link: notListening{}, Logger: log})
	preview.Register(srv, previews)
	projects.Register(srv, projects.New(projects.Options{Runs: svc, Store: st, Link: notListening{}, Previews: previews,
		Redactor: projects.NewRedactor(), TTL: time.Hour, Logger: log}), map[string]func(context.Context) error{})
	git, err := gitexport.New(gitexport.Options{Git: &gitexport.Git{Repos: map[string]*gitexport.Repo{"reports": {
		ID: "reports", Forge: gitexport.ForgeGitea, URL: "http://127.0.0.1:9/acme/reports.git", Owner: "acme", Name: "reports",
		APIURL: "http://127.0.0.1:9/", Token: "token", AllowedBranches: []string{"agent/*"}, BaseBranch: "main",
		Clients: []string{runbox.DefaultClient},
	}}}, Owners: st, Files: fileStore, TempDir: t.TempDir(), Log: log})
	if err != nil {
		t.Fatal(err)
	}
	gitexport.Register(srv, git)

	h := &allFamilies{store: st, clients: map[string]*mcpsdk.ClientSession{}}
	// The limited client's calls come with its tier, as the api's
	// authentication gives them.
	var limited *mcpsdk.ServerSession
	srv.SDK().AddReceivingMiddleware(func(next mcpsdk.MethodHandler) mcpsdk.MethodHandler {
		return func(ctx context.Context, method string, req mcpsdk.Request) (mcpsdk.Result, error) {
			if ss, ok := req.GetSession().(*mcpsdk.ServerSession); ok && ss == limited {
				ctx = auth.WithClient(ctx, clients.Client{Name: "limited", Tier: clients.Tier{CallsPerMinute: 1}})
			}
			return next(ctx, method, req)
		}
	})
	h.connect(t, srv, "")
	limited = h.connect(t, srv, "limited")
	return h
}

// connect connects a client named name.
func (h *allFamilies) connect(t *testing.T, srv *mcp.Server, name string) *mcpsdk.ServerSession {
	t.Helper()
	ctx := context.Background()
	ct, stt := mcpsdk.NewInMemoryTransports()
	ss, err := srv.SDK().Connect(ctx, stt, nil)
	if err != nil {
		t.Fatal(err)
	}
	cs, err := mcpsdk.NewClient(&mcpsdk.Implementation{Name: "golden", Version: "1"}, nil).Connect(ctx, ct, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cs.Close() })
	h.clients[name] = cs
	return ss
}

func (h *allFamilies) tools(t *testing.T) []*mcpsdk.Tool {
	t.Helper()
	list, err := h.clients[""].ListTools(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	return list.Tools
}

// call makes c's call and returns it with its result, told apart from
// the calls of other runs only by what is random or timed: run ids,
// signed URLs, retry_after_seconds.
func (h *allFamilies) call(t *testing.T, c goldenCall) goldenCall {
	t.Helper()
	cid, _ := c.Arguments["conversationId"].(string)
	if cid == "" {
		cid, _ = c.Arguments["session_id"].(string)
	}
	if code, _ := c.Arguments["code"].(string); code == "print(1)" && c.Client == "" {
		done := make(chan struct{})
		go func() {
			defer close(done)
			h.finish(t, cid)
		}()
		defer func() { <-done }()
	}
	res, err := h.clients[c.Client].CallTool(context.Background(), &mcpsdk.CallToolParams{Name: c.Tool, Arguments: c.Arguments})
	if err != nil {
		t.Fatalf("%s: %v", c.Tool, err)
	}
	b, err := json.Marshal(res)
	if err != nil {
		t.Fatal(err)
	}
	var v any
	if err := json.Unmarshal(b, &v); err != nil {
		t.Fatal(err)
	}
	c.Result, err = json.Marshal(normalise(v))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// finish plays the executor for the run a call in conversation cid waits
// on: it prints and leaves one artifact.
func (h *allFamilies) finish(t *testing.T, cid string) {
	ctx := context.Background()
	deadline := time.Now().Add(10 * time.Second)
	for time.Now().Before(deadline) {
		list, _ := h.store.RecentRuns(ctx, "", cid, 10)
		for _, r := range list {
			id := r.ID
			if ok, _ := h.store.Claim(ctx, id, "fake", time.Minute); !ok {
				continue
			}
			h.store.Append(ctx, id, runbox.Event{Type: runbox.EventStdout, Data: "1\n"})
			csv := runbox.FileInfo{Name: "out.csv", Path: "/data/out.csv", SizeBytes: 4, MimeType: "text/csv", URL: "http://test/f/out.csv"}
			chart := runbox.FileInfo{Name: "dot.png", Path: "/data/dot.png", SizeBytes: 70, MimeType: "image/png", URL: "http://test/f/dot.png"}
			h.store.Finish(ctx, id, runbox.Ending{From: []runbox.Status{runbox.StatusRunning}, Lease: runbox.LeaseDelete,
				Status: runbox.StatusSucceeded, Conversation: cid, Result: &runbox.Result{Success: true, Stdout: "1\n", Output: "1\n",
					RunID: id, ConversationID: cid, DurationMS: 7, Files: []runbox.FileInfo{csv, chart}, Artifacts: []runbox.FileInfo{csv, chart}}})
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
	t.Error("no run to finish in " + cid)
}

var (
	runIDs     = regexp.MustCompile(`run_[0-9a-f]{24}`)
	signedURLs = regexp.MustCompile(`http://test/[^"\s]*`)
	retryAfter = regexp.MustCompile(`"retry_after_seconds":[0-9]+`)
)

// normalise replaces what differs from one run to the next.
func normalise(v any) any {
	switch v := v.(type) {
	case map[string]any:
		for k, e := range v {
			if k == "retry_after_seconds" {
				v[k] = "<seconds>"
				continue
			}
			v[k] = normalise(e)
		}
	case []any:
		for i, e := range v {
			v[i] = normalise(e)
		}
	case string:
		if v != "run_000000000000000000000000" {
			v = runIDs.ReplaceAllString(v, "run_<id>")
		}
		v = signedURLs.ReplaceAllString(v, "http://test/<signed>")
		return retryAfter.ReplaceAllString(v, `"retry_after_seconds":"<seconds>"`)
	}
	return v
}

// notListening is the executors as the previews and projects reach
// them, with nothing listening anywhere.
type notListening struct{}

func (notListening) Probe(context.Context, string, string, int) ([]string, error) {
	return nil, link.ErrNotListening
}

func (notListening) Dial(context.Context, string, string, int, []string) (net.Conn, error) {
	return nil, link.ErrGone
}

func (notListening) WriteFiles(context.Context, string, string, []link.File) error {
	return errors.New("no executor")
}

func (notListening) Output(context.Context, string, string) (link.Output, error) {
	return link.Output{}, errors.New("no executor")
}
