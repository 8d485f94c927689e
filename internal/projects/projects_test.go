package projects

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/uuid"
	"github.com/jonboulle/clockwork"
	mcpsdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/runbox-dev/runbox"
	"github.com/runbox-dev/runbox/internal/auth"
	"github.com/runbox-dev/runbox/internal/clients"
	"github.com/runbox-dev/runbox/internal/conversations"
	"github.com/runbox-dev/runbox/internal/files"
	"github.com/runbox-dev/runbox/internal/lifecycle"
	"github.com/runbox-dev/runbox/internal/link"
	"github.com/runbox-dev/runbox/internal/mcp"
	"github.com/runbox-dev/runbox/internal/preview"
	"github.com/runbox-dev/runbox/internal/queue"
	"github.com/runbox-dev/runbox/internal/runs"
	"github.com/runbox-dev/runbox/internal/store"
	"github.com/runbox-dev/runbox/internal/store/stream"
	"github.com/runbox-dev/runbox/internal/testenv"
)

func TestCheckPath(t *testing.T) {
	for _, tc := range []struct {
		path, clean, code string
	}{
		{"src/App.jsx", "src/App.jsx", ""},
		{"./src/App.jsx", "src/App.jsx", ""},
		{"index.html", "index.html", ""},
		{"public/env.js", "public/env.js", ""},
		{"a/b/c/d.css", "a/b/c/d.css", ""},
		{"../secret", "", runbox.EPathTraversal},
		{"src/../../x", "", runbox.EPathTraversal},
		{"src/..", "", runbox.EPathTraversal},
		{"/etc/passwd", "", runbox.EPathTraversal},
		{"/root/.ssh/id_rsa", "", runbox.EPathTraversal},
		{"/data/x", "", runbox.EPathTraversal},
		{"~/x", "", runbox.EPathTraversal},
		{"C:/x", "", runbox.EPathTraversal},
		{`src\..\x`, "", runbox.EPathTraversal},
		{"a\x00b", "", runbox.EPathTraversal},
		{"a\nb", "", runbox.EPathTraversal},
		{"", "", runbox.EPathTraversal},
		{".", "", runbox.EPathTraversal},
		{strings.Repeat("a", 1025), "", runbox.EPathTraversal},
		{".env", "", runbox.EPermissionDenied},
		{".env.local", "", runbox.EPermissionDenied},
		{"config/.ENV", "", runbox.EPermissionDenied},
		{".git/config", "", runbox.EPermissionDenied},
		{".gitignore", "", runbox.EPermissionDenied},
		{".github/workflows/ci.yml", "", runbox.EPermissionDenied},
		{"node_modules/react/index.js", "", runbox.EPermissionDenied},
		{"lib/node_modules_cache/x", "", runbox.EPermissionDenied},
		{".codesandbox/tasks.json", "", runbox.EPermissionDenied},
	} {
		clean, err := checkPath(tc.path)
		if runbox.ErrorCode(err) != tc.code && !(tc.code == "" && err == nil) || clean != tc.clean {
			t.Errorf("checkPath(%q) = %q, %v; want %q, %s", tc.path, clean, err, tc.clean, tc.code)
		}
	}
}

func TestCheckFiles(t *testing.T) {
	many := func(n, size int) mcp.Files {
		var fs mcp.Files
		for i := range n {
			fs = append(fs, mcp.FileArg{Path: fmt.Sprintf("f%d.txt", i), Content: strings.Repeat("x", size)})
		}
		return fs
	}
	record := func(js string) mcp.Files {
		var fs mcp.Files
		if err := json.Unmarshal([]byte(js), &fs); err != nil {
			t.Fatal(err)
		}
		return fs
	}
	for _, tc := range []struct {
		name            string
		files           mcp.Files
		maxFiles, bytes int
		code            string
	}{
		{"initial: 20 of 1 MB", many(20, MaxInitialFileBytes), MaxInitialFiles, MaxInitialFileBytes, ""},
		{"initial: 21 files", many(21, 1), MaxInitialFiles, MaxInitialFileBytes, runbox.EGatewayQuota},
		{"initial: 1 MB and a byte", many(1, MaxInitialFileBytes+1), MaxInitialFiles, MaxInitialFileBytes, runbox.EFileSizeExceeded},
		{"write: 10 of 500 KB", many(10, MaxWriteFileBytes), MaxWriteFiles, MaxWriteFileBytes, ""},
		{"write: 11 files", many(11, 1), MaxWriteFiles, MaxWriteFileBytes, runbox.EGatewayQuota},
		{"write: 500 KB and a byte", many(1, MaxWriteFileBytes+1), MaxWriteFiles, MaxWriteFileBytes, runbox.EFileSizeExceeded},
		{"the same file twice", record(`{"a.js": "1", "./a.js": "2"}`), MaxWriteFiles, MaxWriteFileBytes, runbox.EInvalid},
		{"a bad path", record(`{"ok.js": "1", "../x": "2"}`), MaxWriteFiles, MaxWriteFileBytes, runbox.EPathTraversal},
		{"the list form, base64", record(`[{"path": "a.png", "content": "iVBORw0K", "encoding": "base64"}]`), MaxWriteFiles, MaxWriteFileBytes, ""},
		{"bad base64", record(`[{"path": "a.png", "content": "!!", "encoding": "base64"}]`), MaxWriteFiles, MaxWriteFileBytes, runbox.EInvalid},
		{"500 KB and a byte in base64", mcp.Files{{Path: "a.bin", Encoding: "base64",
			Content: base64.StdEncoding.EncodeToString(make([]byte, MaxWriteFileBytes+1))}}, MaxWriteFiles, MaxWriteFileBytes, runbox.EFileSizeExceeded},
	} {
		_, err := checkFiles(tc.files, tc.maxFiles, tc.bytes)
		if got := runbox.ErrorCode(err); err != nil && got != tc.code || err == nil && tc.code != "" {
			t.Errorf("%s: %v, want %q", tc.name, err, tc.code)
		}
	}
}

func TestRedact(t *testing.T) {
	r := NewRedactor("e2e-file-secret-XYZ", "the-api-token-1234", "short")
	for _, tc := range []struct{ in, want string }{
		{"GET /?token=abcdef123456 200", "GET /?token=[REDACTED] 200"},
		{"GET /api?x=1&api_key=sk-live-000 200", "GET /api?x=1&api_key=[REDACTED] 200"},
		{"using ghp_0123456789abcdefghijABCDEFGHIJ012345", "using [REDACTED]"},
		{"AWS AKIAIOSFODNN7EXAMPLE here", "AWS [REDACTED] here"},
		{"OPENAI_API_KEY=sk-proj-abcdefghijklmnop1234", "OPENAI_API_KEY=[REDACTED]"},
		{`{"password": "hunter22"}`, `{"password": "[REDACTED]"}`},
		{"DB_PASSWORD: correct-horse", "DB_PASSWORD: [REDACTED]"},
		{"Authorization: Bearer abcdefghijklmnopqrstuvwxyz", "Authorization: Bearer [REDACTED]"},
		{"postgres://app:s3cr3t@db:5432/x", "postgres://app:[REDACTED]@db:5432/x"},
		{"jwt eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U",
			"jwt [REDACTED]"},
		{"-----BEGIN RSA PRIVATE KEY-----\nMIIEow\n-----END RSA PRIVATE KEY-----\nafter", "[REDACTED]\nafter"},
		{"xoxb-1234567890-abcdef slack", "[REDACTED] slack"},
		{"runbox token rb_ABCDEFGHIJKLMNOPQRSTUVWXYZ", "runbox token [REDACTED]"},
		{"secret is e2e-file-secret-XYZ!", "secret is [REDACTED]!"},
		{"x the-api-token-1234 y", "x [REDACTED] y"},
		{"short words stay short", "short words stay short"},
		{"GET /assets/app.js 200", "GET /assets/app.js 200"},
		{"[watch] build finished, watching for changes...", "[watch] build finished, watching for changes..."},
	} {
		if got := r.Redact(tc.in); got != tc.want {
			t.Errorf("Redact(%q) = %q, want %q", tc.in, got, tc.want)
		}
	}
}

// listening is an executor's side where every conversation's sandbox
// listens on every port (a test server), and files are kept.
type listening struct {
	addr    string
	mu      sync.Mutex
	written map[string][]link.File
	output  link.Output
}

func (l *listening) Sandboxes(string) []string { return []string{"sb1"} }
func (l *listening) DialPort(ctx context.Context, _ string, _ int) (net.Conn, error) {
	var d net.Dialer
	return d.DialContext(ctx, "tcp", l.addr)
}
func (l *listening) WriteFiles(_ context.Context, conv string, files []link.File) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.written[conv] = append(l.written[conv], files...)
	return nil
}
func (l *listening) Output(string) (link.Output, bool) { return l.output, true }

type fixture struct {
	svc   *Service
	cs    *mcpsdk.ClientSession
	store *store.Store
	back  *listening
	convs *conversations.Service
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	_, url := testenv.Miniredis(t)
	rdb := testenv.Client(t, url)
	conn := store.NewConn(rdb)
	st := store.New(conn)
	log := slog.New(slog.DiscardHandler)
	hub := stream.NewHub(conn, st, log)
	t.Cleanup(func() { hub.Close() })
	ctx := context.Background()
	st.Heartbeat(ctx, runbox.ExecutorInfo{ID: "ex1", Runners: []runbox.Runner{{Language: "bash"}},
		Templates: []runbox.Template{{Name: "react", Port: 3000}, {Name: "node", Port: 3000}}}, time.Hour)
	rs := runs.NewService(st, hub, queue.NewScheduler(st, queue.NewClient(conn), log),
		runs.Limits{MaxCodeBytes: 1000, MaxTimeoutSeconds: 60, MaxStdinBytes: 100, MaxWaiting: 4}, log)
	folders, err := files.NewFolders(t.TempDir(), files.Options{UID: os.Getuid(), GID: os.Getgid(), Quota: 1 << 20, Mode: files.QuotaWalk})
	if err != nil {
		t.Fatal(err)
	}
	convs := conversations.NewService(files.NewHostStore(folders), files.NewSigner([]byte("0123456789abcdef0123456789abcdef"), "http://test", time.Hour),
		rs, st, nil, conversations.Limits{MaxUpload: 1000, MaxRead: 1000})
	app := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { fmt.Fprint(w, "app") }))
	t.Cleanup(app.Close)
	back := &listening{addr: app.Listener.Addr().String(), written: map[string][]link.File{}}
	l := link.Local{ID: "ex1", Backend: back}
	domain, _ := preview.ParseDomain("localhost:8080", "http")
	previews := preview.NewService(preview.Options{Key: []byte("0123456789abcdef0123456789abcdef"), Domain: domain, TTL: time.Hour, Store: st, Link: l})
	svc := New(Options{Runs: rs, Store: st, Link: l, Previews: previews, Redactor: NewRedactor("planted-runbox-secret"), TTL: time.Hour, Logger: log})

	srv := mcp.New(ctx, mcp.Options{Runs: rs, Conversations: convs, Log: log})
	Register(srv, svc, map[string]func(context.Context) error{"redis": func(ctx context.Context) error { return rdb.Ping(ctx).Err() }})
	ct, stt := mcpsdk.NewInMemoryTransports()
	if _, err := srv.SDK().Connect(ctx, stt, nil); err != nil {
		t.Fatal(err)
	}
	cs, err := mcpsdk.NewClient(&mcpsdk.Implementation{Name: "test", Version: "1"}, nil).Connect(ctx, ct, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cs.Close() })
	return &fixture{svc: svc, cs: cs, store: st, back: back, convs: convs}
}

// call calls a tool and returns its structured content and whether it was
// a tool error.
func (f *fixture) call(t *testing.T, name string, args map[string]any) (map[string]any, bool) {
	t.Helper()
	res, err := f.cs.CallTool(context.Background(), &mcpsdk.CallToolParams{Name: name, Arguments: args})
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	b, _ := json.Marshal(res.StructuredContent)
	var m map[string]any
	_ = json.Unmarshal(b, &m)
	return m, res.IsError
}

func TestTools(t *testing.T) {
	f := newFixture(t)
	created, isErr := f.call(t, "create_sandbox_for_project", map[string]any{
		"project_name": "my-app_1", "template": "react",
		"initial_files": map[string]any{"src/App.jsx": "export default () => 'hi'", "./index.html": "<div id=root>"},
	})
	if isErr {
		t.Fatalf("create: %v", created)
	}
	id, _ := created["sandbox_id"].(string)
	if _, err := uuid.Parse(id); err != nil || !strings.HasPrefix(created["preview_url"].(string), "http://") {
		t.Fatalf("created %v", created)
	}
	if got := f.back.written[id]; len(got) != 2 || got[0].Path != "index.html" || got[1].Path != "src/App.jsx" {
		t.Errorf("initial files written: %v", got)
	}
	p, err := f.store.Project(context.Background(), id)
	if err != nil || p.Template != "react" || p.Port != 3000 || p.Name != "my-app_1" {
		t.Errorf("project %+v %v", p, err)
	}

	w, isErr := f.call(t, "write_files_to_sandbox", map[string]any{"sandbox_id": id, "files": map[string]any{"src/App.jsx": "v2"}})
	if isErr || w["success"] != true || w["files_written"] != float64(1) {
		t.Errorf("write: %v", w)
	}
	f.back.output = link.Output{Stdout: "GET /?api_key=abcdef123456 200\nplanted-runbox-secret\n", Stderr: "✘ [ERROR] Expected \";\"\n"}
	out, isErr := f.call(t, "get_sandbox_output", map[string]any{"sandbox_id": id, "output_type": "console_log"})
	if isErr || out["output"] != "GET /?api_key=[REDACTED] 200\n[REDACTED]\n" || out["running"] != true {
		t.Errorf("console_log: %v", out)
	}
	out, _ = f.call(t, "get_sandbox_output", map[string]any{"sandbox_id": id, "output_type": "build_output"})
	if !strings.Contains(out["output"].(string), "[ERROR] Expected") {
		t.Errorf("build_output: %v", out)
	}
	f.back.output = link.Output{Stdout: "cut-line\n" + strings.Repeat("line\n", 20<<10), StdoutDropped: 10}
	out, _ = f.call(t, "get_sandbox_output", map[string]any{"sandbox_id": id, "output_type": "console_log"})
	if s := out["output"].(string); len(s) > MaxOutputBytes || out["truncated"] != true || strings.Contains(s, "cut-line") {
		t.Errorf("a long console_log: %d bytes, truncated %v", len(s), out["truncated"])
	}
	out, _ = f.call(t, "get_sandbox_output", map[string]any{"sandbox_id": id, "output_type": "preview_url"})
	if !strings.HasPrefix(out["output"].(string), "http://") {
		t.Errorf("preview_url: %v", out)
	}

	random := uuid.NewString()
	for _, tc := range []struct {
		name string
		tool string
		args map[string]any
		code string
	}{
		{"name empty", "create_sandbox_for_project", map[string]any{"project_name": "", "template": "react"}, runbox.EInvalid},
		{"name too long", "create_sandbox_for_project", map[string]any{"project_name": strings.Repeat("a", 51), "template": "react"}, runbox.EInvalid},
		{"name with a dot", "create_sandbox_for_project", map[string]any{"project_name": "a.b", "template": "react"}, runbox.EInvalid},
		{"traversal", "create_sandbox_for_project", map[string]any{"project_name": "a", "template": "react",
			"initial_files": map[string]any{"../x": "1"}}, runbox.EPathTraversal},
		{".env", "create_sandbox_for_project", map[string]any{"project_name": "a", "template": "react",
			"initial_files": map[string]any{".env": "KEY=1"}}, runbox.EPermissionDenied},
		{"initial file too large", "create_sandbox_for_project", map[string]any{"project_name": "a", "template": "react",
			"initial_files": map[string]any{"a.js": strings.Repeat("x", MaxInitialFileBytes+1)}}, runbox.EFileSizeExceeded},
		{"template missing", "create_sandbox_for_project", map[string]any{"project_name": "a", "template": "next"}, runbox.ETemplateUnavailable},
		{"write: not a uuid", "write_files_to_sandbox", map[string]any{"sandbox_id": "../x", "files": map[string]any{"a": "1"}}, runbox.ESandboxNotFound},
		{"write: unknown", "write_files_to_sandbox", map[string]any{"sandbox_id": random, "files": map[string]any{"a": "1"}}, runbox.ESandboxNotFound},
		{"write: too many", "write_files_to_sandbox", map[string]any{"sandbox_id": id, "files": func() map[string]any {
			m := map[string]any{}
			for i := range 11 {
				m[fmt.Sprint(i)] = "x"
			}
			return m
		}()}, runbox.EGatewayQuota},
		{"write: too large", "write_files_to_sandbox", map[string]any{"sandbox_id": id, "files": map[string]any{"a.js": strings.Repeat("x", MaxWriteFileBytes+1)}}, runbox.EFileSizeExceeded},
		{"write: node_modules", "write_files_to_sandbox", map[string]any{"sandbox_id": id, "files": map[string]any{"node_modules/x.js": "1"}}, runbox.EPermissionDenied},
		{"write: absolute", "write_files_to_sandbox", map[string]any{"sandbox_id": id, "files": map[string]any{"/etc/passwd": "1"}}, runbox.EPathTraversal},
		{"write: nothing", "write_files_to_sandbox", map[string]any{"sandbox_id": id, "files": map[string]any{}}, runbox.EInvalid},
		{"output: unknown", "get_sandbox_output", map[string]any{"sandbox_id": random, "output_type": "console_log"}, runbox.ESandboxNotFound},
		{"output: bad type", "get_sandbox_output", map[string]any{"sandbox_id": id, "output_type": "stdout"}, runbox.EInvalid},
	} {
		got, isErr := f.call(t, tc.tool, tc.args)
		if !isErr || got["error"] != tc.code {
			t.Errorf("%s: %v, want %s", tc.name, got, tc.code)
		}
		if tc.code == runbox.ETemplateUnavailable && fmt.Sprint(got["available"]) != "[node react]" {
			t.Errorf("template_unavailable lists %v", got["available"])
		}
	}
}

// TestOtherClient checks that another client's sandbox_id names nothing.
func TestOtherClient(t *testing.T) {
	f := newFixture(t)
	ctx := context.Background()
	created, err := f.svc.Create(ctx, CreateInput{ProjectName: "p", Template: "node"})
	if err != nil {
		t.Fatal(err)
	}
	other := auth.WithClient(ctx, clients.Client{Name: "other"})
	if _, err := f.svc.Write(other, WriteInput{SandboxID: created.SandboxID, Files: mcp.Files{{Path: "a.js", Content: "1"}}}); runbox.ErrorCode(err) != runbox.ESandboxNotFound {
		t.Errorf("another client wrote: %v", err)
	}
	if _, err := f.svc.Output(other, OutputInput{SandboxID: created.SandboxID, OutputType: ConsoleLog}); runbox.ErrorCode(err) != runbox.ESandboxNotFound {
		t.Errorf("another client read: %v", err)
	}
}

// TestNewConversationsPerHour checks that projects count towards the
// tier's new conversations an hour.
func TestNewConversationsPerHour(t *testing.T) {
	f := newFixture(t)
	ctx := auth.WithClient(context.Background(), clients.Client{Name: "trial", Tier: clients.Tier{NewConversationsPerHour: 2}})
	for i := range 2 {
		if _, err := f.svc.Create(ctx, CreateInput{ProjectName: "p", Template: "node"}); err != nil {
			t.Fatalf("project %d: %v", i, err)
		}
	}
	_, err := f.svc.Create(ctx, CreateInput{ProjectName: "p", Template: "node"})
	if runbox.ErrorCode(err) != runbox.ERateLimited || runbox.RetryAfterSeconds(err) == 0 {
		t.Errorf("a third project in the hour: %v", err)
	}
}

func TestToolsListed(t *testing.T) {
	f := newFixture(t)
	res, err := f.cs.ListTools(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	want := map[string][2]bool{ // read-only, idempotent
		"create_sandbox_for_project": {false, false},
		"write_files_to_sandbox":     {false, false},
		"get_sandbox_output":         {true, true},
	}
	for _, tool := range res.Tools {
		w, ok := want[tool.Name]
		if !ok {
			continue
		}
		delete(want, tool.Name)
		if tool.Annotations.ReadOnlyHint != w[0] || tool.Annotations.IdempotentHint != w[1] || tool.OutputSchema == nil {
			t.Errorf("%s: annotations %+v", tool.Name, tool.Annotations)
		}
	}
	if len(want) > 0 {
		t.Errorf("not listed: %v", want)
	}
	rr, err := f.cs.ReadResource(context.Background(), &mcpsdk.ReadResourceParams{URI: "health://check"})
	if err != nil {
		t.Fatal(err)
	}
	var h Health
	if err := json.Unmarshal([]byte(rr.Contents[0].Text), &h); err != nil || h.Status != "healthy" ||
		h.Dependencies["redis"] != "ok" || h.Timestamp.IsZero() || h.Uptime < 0 {
		t.Errorf("health %s", rr.Contents[0].Text)
	}
}

func TestJanitor(t *testing.T) {
	f := newFixture(t)
	ctx := auth.WithClient(context.Background(), clients.Client{Name: "gw"})
	created, err := f.svc.Create(ctx, CreateInput{ProjectName: "p", Template: "node"})
	if err != nil {
		t.Fatal(err)
	}
	key := "~gw~" + created.SandboxID
	p, err := f.store.Project(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	clock := clockwork.NewFakeClockAt(time.Now())
	j := NewJanitor(f.store, f.convs, lifecycle.Periodic(clock), clock, slog.New(slog.DiscardHandler))
	j.Sweep(context.Background())
	if _, err := f.store.Project(ctx, key); err != nil {
		t.Fatalf("a live project was destroyed: %v", err)
	}
	clock.Advance(time.Hour + time.Second)
	j.Sweep(context.Background())
	if expired, _ := f.store.ExpiredProjects(ctx, clock.Now(), 10); len(expired) != 0 {
		t.Errorf("still listed: %v", expired)
	}
	run, err := f.store.Run(ctx, p.RunID)
	if err != nil || run.Status != runbox.StatusCancelled {
		t.Errorf("the dev server's run after the project's end: %v %v", run.Status, err)
	}
}
