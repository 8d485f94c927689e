package gitexport_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	mcpsdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/runbox-dev/runbox/internal/app"
	"github.com/runbox-dev/runbox/internal/testenv"
)

// Client tokens of the api under test.
const (
	aliceToken = "alice-token-0123456789"
	bobToken   = "bob-token-0123456789"
	carolToken = "carol-token-0123456789"
)

// forge is a real Gitea with the repositories the tests use: owner/reports
// (alice's), owner/other (bob's) and owner/locked (alice's, with a token
// that may only read), each reached as "bot", a collaborator with write
// access, as docs/git.md tells operators to set it up.
type forge struct {
	*testenv.Gitea
	botWrite, botRead string // tokens
}

func startForge(t *testing.T) *forge {
	t.Helper()
	g := testenv.StartGitea(t)
	g.CreateUser("owner")
	g.CreateUser("bot")
	for _, r := range []string{"reports", "other", "locked"} {
		g.CreateRepo("owner", r)
		g.AddCollaborator("owner", r, "bot", "write")
	}
	return &forge{Gitea: g, botWrite: g.Token("bot", "write:repository"), botRead: g.Token("bot", "read:repository")}
}

// service is runbox's api, in this process, as `api` runs it (real
// redis-server, a host folder for files, GIT_REPOS_FILE), with its log.
type service struct {
	url  string
	cfg  *app.Config
	logs *syncBuffer
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

func (f *forge) reposFile(t *testing.T) string {
	t.Helper()
	return testenv.WriteFile(t, "repos.yaml", fmt.Sprintf(`
author: {name: Runbox Test, email: runbox-test@example.com}
repos:
  reports:
    forge: gitea
    url: %s
    token: %s
    allowed_branches: ["runbox/*"]
    base_branch: main
    clients: [alice, carol]
  other:
    forge: forgejo
    url: %s
    token_file: %s
    clients: [bob]
  locked:
    forge: gitea
    url: %s
    token: %s
    clients: [alice]
`, f.RepoURL("owner", "reports"), f.botWrite, f.RepoURL("owner", "other"), testenv.WriteFile(t, "other.token", f.botWrite+"\n"),
		f.RepoURL("owner", "locked"), f.botRead))
}

func startService(t *testing.T, env map[string]string) (*service, error) {
	t.Helper()
	clientsFile := testenv.WriteFile(t, "clients.yaml", `
tiers: {tiny: {calls_per_minute: 3}}
clients: [{name: carol, token: `+carolToken+`, tier: tiny}]
`)
	base := map[string]string{
		"MCP_HTTP_ADDR":      "127.0.0.1:0",
		"MCP_API_TOKENS":     "alice:" + aliceToken + ",bob:" + bobToken,
		"CLIENTS_FILE":       clientsFile,
		"REDIS_URL":          testenv.Redis(t),
		"SANDBOX_ROOT":       t.TempDir(),
		"SANDBOX_QUOTA_MODE": "walk",
		"AUDIT_KEY":          "audit-key-0123456789abcdef",
		"FILE_SECRET":        "file-secret-0123456789abcdef",
	}
	for k, v := range env {
		base[k] = v
	}
	cfg, err := app.Load(func(k string) string { return base[k] })
	if err != nil {
		return nil, err
	}
	s := &service{cfg: cfg, logs: &syncBuffer{}}
	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan string, 1)
	done := make(chan error, 1)
	go func() {
		done <- app.RunAPI(ctx, cfg, app.APIOptions{
			Logger: slog.New(slog.NewTextHandler(s.logs, &slog.HandlerOptions{Level: slog.LevelDebug})),
			Ready:  ready,
		})
	}()
	select {
	case addr := <-ready:
		s.url = "http://" + addr
		t.Cleanup(func() {
			cancel()
			<-done
			if t.Failed() {
				t.Logf("--- api ---\n%s", s.logs.String())
			}
		})
		return s, nil
	case err := <-done:
		cancel()
		return nil, err
	case <-time.After(60 * time.Second):
		cancel()
		t.Fatal("the api did not start")
		return nil, nil
	}
}

// call calls a tool and returns its structured answer and whether it is a
// tool error.
func call(t *testing.T, cs *mcpsdk.ClientSession, tool string, args map[string]any) (map[string]any, bool) {
	t.Helper()
	res, err := cs.CallTool(context.Background(), &mcpsdk.CallToolParams{Name: tool, Arguments: args})
	if err != nil {
		t.Fatalf("%s: %v", tool, err)
	}
	var out map[string]any
	b, _ := json.Marshal(res.StructuredContent)
	if err := json.Unmarshal(b, &out); err != nil || out == nil {
		t.Fatalf("%s: no structured answer: %+v", tool, res)
	}
	// The text block holds the same JSON, for clients without
	// structured output.
	if len(res.Content) == 0 {
		t.Fatalf("%s: no text content", tool)
	}
	if tc, ok := res.Content[0].(*mcpsdk.TextContent); !ok || !json.Valid([]byte(tc.Text)) {
		t.Fatalf("%s: the text content is not the JSON: %+v", tool, res.Content[0])
	}
	return out, res.IsError
}

func mustCall(t *testing.T, cs *mcpsdk.ClientSession, tool string, args map[string]any) map[string]any {
	t.Helper()
	out, isErr := call(t, cs, tool, args)
	if isErr {
		t.Fatalf("%s: %v", tool, out)
	}
	return out
}

func wantError(t *testing.T, cs *mcpsdk.ClientSession, tool, code string, args map[string]any) map[string]any {
	t.Helper()
	out, isErr := call(t, cs, tool, args)
	if !isErr || out["error"] != code {
		t.Fatalf("%s %v: got %v (isError %v), want the error %s", tool, args, out, isErr, code)
	}
	if msg, _ := out["message"].(string); msg == "" || strings.Contains(msg, "/tmp") || strings.Contains(msg, "127.0.0.1") {
		t.Errorf("%s: message %q is empty or names a host path or the forge", tool, msg)
	}
	return out
}

// branch returns a branch's tip commit in Gitea, or "" when it does not
// exist.
func (f *forge) branch(t *testing.T, repo, name string) string {
	t.Helper()
	var b struct {
		Commit struct {
			ID string `json:"id"`
		} `json:"commit"`
	}
	if f.API("GET", "/repos/owner/"+repo+"/branches/"+name, f.AdminToken, nil, &b) != http.StatusOK {
		return ""
	}
	return b.Commit.ID
}

type commitInfo struct {
	SHA    string `json:"sha"`
	Commit struct {
		Message string `json:"message"`
		Author  struct {
			Name  string `json:"name"`
			Email string `json:"email"`
		} `json:"author"`
	} `json:"commit"`
	Parents []struct {
		SHA string `json:"sha"`
	} `json:"parents"`
	Files []struct {
		Filename string `json:"filename"`
	} `json:"files"`
}

func (f *forge) commit(t *testing.T, repo, sha string) commitInfo {
	t.Helper()
	var c commitInfo
	if s := f.API("GET", "/repos/owner/"+repo+"/git/commits/"+sha, f.AdminToken, nil, &c); s != http.StatusOK {
		t.Fatalf("commit %s: status %d", sha, s)
	}
	return c
}

func (f *forge) must(t *testing.T, method, path string, body any) {
	t.Helper()
	if s := f.API(method, path, f.AdminToken, body, nil); s >= 300 {
		t.Fatalf("%s %s: status %d", method, path, s)
	}
}

// raw reads a file of a branch as Gitea serves it.
func (f *forge) raw(t *testing.T, repo, branch, path string) []byte {
	t.Helper()
	req, _ := http.NewRequest("GET", f.URL+"api/v1/repos/owner/"+repo+"/raw/"+path+"?ref="+branch, nil)
	req.Header.Set("Authorization", "token "+f.AdminToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("raw %s@%s: %d %s", path, branch, resp.StatusCode, b)
	}
	return b
}

// TestGitea: the git tools against a real Gitea, through runbox's api as
// it runs (GIT_REPOS_FILE, clients, tiers, audit), over MCP.
func TestGitea(t *testing.T) {
	f := startForge(t)
	svc, err := startService(t, map[string]string{"GIT_REPOS_FILE": f.reposFile(t)})
	if err != nil {
		t.Fatal(err)
	}
	alice := testenv.Session(t, svc.url+"/mcp", aliceToken, nil)
	bob := testenv.Session(t, svc.url+"/mcp", bobToken, nil)
	mainTip := f.branch(t, "reports", "main")

	t.Run("tools are described as the gateway gives them", func(t *testing.T) {
		list, err := alice.ListTools(context.Background(), nil)
		if err != nil {
			t.Fatal(err)
		}
		found := 0
		for _, tool := range list.Tools {
			a := tool.Annotations
			switch tool.Name {
			case "commit_and_push_to_github":
				found++
				if a.ReadOnlyHint || a.IdempotentHint || *a.DestructiveHint || !*a.OpenWorldHint || tool.OutputSchema == nil {
					t.Errorf("commit annotations %+v", a)
				}
			case "read_github_file":
				found++
				if !a.ReadOnlyHint || !a.IdempotentHint || *a.DestructiveHint || !*a.OpenWorldHint || tool.OutputSchema == nil {
					t.Errorf("read annotations %+v", a)
				}
			}
		}
		if found != 2 {
			t.Fatalf("%d git tools listed", found)
		}
	})

	t.Run("inline files, one commit, and a pull request", func(t *testing.T) {
		png := []byte("\x89PNG\r\n\x1a\n\x00binary\xff")
		out := mustCall(t, alice, "commit_and_push_to_github", map[string]any{
			"repo_id": "reports", "branch": "runbox/q3-report",
			"files": []map[string]any{
				{"path": "docs/q3/report.md", "content": "# Q3\n\nRevenue grew.\n"},
				{"path": "docs/q3/numbers.csv", "content": "region,revenue\nnorth,10\n"},
				{"path": "docs/q3/chart.png", "content": base64.StdEncoding.EncodeToString(png), "encoding": "base64"},
				{"path": "README.md", "content": "# reports\n\nnow with Q3\n"},
			},
			"commit_message": "Add the Q3 report",
			"create_pr":      true,
			"pr_title":       "Q3 report from the analysis",
		})
		sha, _ := out["commit_sha"].(string)
		if out["success"] != true || len(sha) != 40 || !strings.Contains(out["pr_url"].(string), "/owner/reports/pulls/") {
			t.Fatalf("answer %v", out)
		}
		if tip := f.branch(t, "reports", "runbox/q3-report"); tip != sha {
			t.Fatalf("branch tip %s, answer %s", tip, sha)
		}
		c := f.commit(t, "reports", sha)
		if len(c.Parents) != 1 || c.Parents[0].SHA != mainTip {
			t.Errorf("the commit's parents are %+v, want main's tip %s: one commit on main", c.Parents, mainTip)
		}
		if c.Commit.Author.Name != "Runbox Test" || c.Commit.Author.Email != "runbox-test@example.com" {
			t.Errorf("author %+v", c.Commit.Author)
		}
		if !strings.HasPrefix(c.Commit.Message, "Add the Q3 report\n\n") || !strings.Contains(c.Commit.Message, "Runbox-Client: alice\n") ||
			!strings.Contains(c.Commit.Message, "Runbox-Audit-Call: ") {
			t.Errorf("message %q lacks its trailers", c.Commit.Message)
		}
		if got := f.raw(t, "reports", "runbox/q3-report", "docs/q3/chart.png"); !bytes.Equal(got, png) {
			t.Errorf("the binary file came back as %q", got)
		}
		if got := string(f.raw(t, "reports", "main", "README.md")); strings.Contains(got, "Q3") {
			t.Error("main changed")
		}

		var prs []struct {
			Number int    `json:"number"`
			Title  string `json:"title"`
			Head   struct {
				Ref string `json:"ref"`
			} `json:"head"`
			Base struct {
				Ref string `json:"ref"`
			} `json:"base"`
		}
		f.API("GET", "/repos/owner/reports/pulls?state=open", f.AdminToken, nil, &prs)
		if len(prs) != 1 || prs[0].Title != "Q3 report from the analysis" || prs[0].Head.Ref != "runbox/q3-report" || prs[0].Base.Ref != "main" {
			t.Fatalf("pull requests %+v", prs)
		}
		req, _ := http.NewRequest("GET", fmt.Sprintf("%sapi/v1/repos/owner/reports/pulls/%d.diff", f.URL, prs[0].Number), nil)
		req.Header.Set("Authorization", "token "+f.AdminToken)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		diff, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		for _, want := range []string{"b/docs/q3/report.md", "+Revenue grew.", "b/docs/q3/numbers.csv", "+north,10", "b/docs/q3/chart.png", "+now with Q3"} {
			if !bytes.Contains(diff, []byte(want)) {
				t.Errorf("the pull request's diff lacks %q:\n%s", want, diff)
			}
		}

		// A second commit to the same branch goes on top of the first, and
		// finds the pull request open already.
		again := mustCall(t, alice, "commit_and_push_to_github", map[string]any{
			"repo_id": "reports", "branch": "runbox/q3-report",
			"files":          []map[string]any{{"path": "docs/q3/report.md", "content": "# Q3\n\nRevenue grew 10%.\n"}},
			"commit_message": "Say by how much", "create_pr": true,
		})
		if again["pr_url"] != out["pr_url"] {
			t.Errorf("the second commit's pull request %v, want %v", again["pr_url"], out["pr_url"])
		}
		if c := f.commit(t, "reports", again["commit_sha"].(string)); len(c.Parents) != 1 || c.Parents[0].SHA != sha {
			t.Errorf("the second commit's parents %+v, want %s", c.Parents, sha)
		}
		if got := string(f.raw(t, "reports", "runbox/q3-report", "docs/q3/numbers.csv")); got != "region,revenue\nnorth,10\n" {
			t.Errorf("a file the second commit did not name changed: %q", got)
		}
	})

	t.Run("files of a conversation's /data", func(t *testing.T) {
		csv := strings.Repeat("day,visits\n1,100\n", 1000)
		for name, content := range map[string]string{"summary.md": "# Summary\n", "visits.csv": csv} {
			mustCall(t, alice, "upload_file", map[string]any{
				"conversationId": "analysis-1", "filename": name, "content_base64": base64.StdEncoding.EncodeToString([]byte(content)),
			})
		}
		out := mustCall(t, alice, "commit_and_push_to_github", map[string]any{
			"repo_id": "reports", "branch": "runbox/analysis-1",
			"conversationId": "analysis-1", "paths": []string{"/data/summary.md", "/mnt/data/visits.csv"},
			"target_dir": "analyses/1", "commit_message": "Add the visits analysis", "create_pr": true,
		})
		files := out["files"].([]any)
		if len(files) != 2 || files[1].(map[string]any)["path"] != "analyses/1/visits.csv" ||
			files[1].(map[string]any)["size"] != float64(len(csv)) {
			t.Fatalf("answer %v", out)
		}
		if got := string(f.raw(t, "reports", "runbox/analysis-1", "analyses/1/visits.csv")); got != csv {
			t.Error("the conversation's file differs in the repository")
		}
		c := f.commit(t, "reports", out["commit_sha"].(string))
		if !strings.Contains(c.Commit.Message, "Runbox-Conversation: analysis-1\n") {
			t.Errorf("message %q does not name the conversation", c.Commit.Message)
		}
		// bob's conversation of the same id is bob's: alice's files are
		// not in it.
		wantError(t, bob, "commit_and_push_to_github", "INVALID_REPO", map[string]any{
			"repo_id": "reports", "branch": "runbox/x", "conversationId": "analysis-1", "paths": []string{"summary.md"}, "commit_message": "m",
		})
		wantError(t, bob, "commit_and_push_to_github", "NOT_FOUND", map[string]any{
			"repo_id": "other", "branch": "runbox/x", "conversationId": "analysis-1", "paths": []string{"summary.md"}, "commit_message": "m",
		})
		// A file over the limit in /data is refused like an inline one.
		big := base64.StdEncoding.EncodeToString(bytes.Repeat([]byte("x"), 600<<10))
		mustCall(t, alice, "upload_file", map[string]any{"conversationId": "analysis-1", "filename": "big.bin", "content_base64": big})
		wantError(t, alice, "commit_and_push_to_github", "FILE_SIZE_EXCEEDED", map[string]any{
			"repo_id": "reports", "branch": "runbox/big", "conversationId": "analysis-1", "paths": []string{"big.bin"}, "commit_message": "m",
		})
		wantError(t, alice, "commit_and_push_to_github", "PATH_TRAVERSAL", map[string]any{
			"repo_id": "reports", "branch": "runbox/x", "conversationId": "analysis-1", "paths": []string{"../analysis-2/x"}, "commit_message": "m",
		})
	})

	t.Run("read a file back", func(t *testing.T) {
		out := mustCall(t, alice, "read_github_file", map[string]any{"repo_id": "reports", "file_path": "docs/q3/report.md", "branch": "runbox/q3-report"})
		if out["content"] != "# Q3\n\nRevenue grew 10%.\n" || out["size"] != float64(len(out["content"].(string))) || out["binary"] != false || out["encoding"] != "utf-8" {
			t.Errorf("read %v", out)
		}
		bin := mustCall(t, alice, "read_github_file", map[string]any{"repo_id": "reports", "file_path": "docs/q3/chart.png", "branch": "runbox/q3-report"})
		if b, _ := base64.StdEncoding.DecodeString(bin["content"].(string)); bin["binary"] != true || bin["encoding"] != "base64" || !bytes.HasPrefix(b, []byte("\x89PNG")) {
			t.Errorf("binary read %v", bin)
		}
		// The default branch is the base branch.
		readme := mustCall(t, alice, "read_github_file", map[string]any{"repo_id": "reports", "file_path": "README.md"})
		if readme["branch"] != "main" || !strings.HasPrefix(readme["content"].(string), "# reports") {
			t.Errorf("README of main: %v", readme)
		}
		wantError(t, alice, "read_github_file", "NOT_FOUND", map[string]any{"repo_id": "reports", "file_path": "nope.md"})
		wantError(t, alice, "read_github_file", "PATH_TRAVERSAL", map[string]any{"repo_id": "reports", "file_path": "../x"})
		wantError(t, alice, "read_github_file", "PATH_TRAVERSAL", map[string]any{"repo_id": "reports", "file_path": ".env"})
		wantError(t, alice, "read_github_file", "INVALID_BRANCH", map[string]any{"repo_id": "reports", "file_path": "README.md", "branch": "release"})
		wantError(t, alice, "read_github_file", "INVALID_REPO", map[string]any{"repo_id": "other", "file_path": "README.md"})
		// A token that may only read still reads.
		if out := mustCall(t, alice, "read_github_file", map[string]any{"repo_id": "locked", "file_path": "README.md"}); out["size"] == float64(0) {
			t.Errorf("locked read %v", out)
		}
		// Larger than 1 MB (put there by someone else): refused, not
		// truncated.
		f.must(t, "POST", "/repos/owner/reports/contents/big.txt", map[string]any{
			"content": base64.StdEncoding.EncodeToString(bytes.Repeat([]byte("y"), 1_000_001)), "new_branch": "runbox/big-read",
			"message": "a big file",
		})
		wantError(t, alice, "read_github_file", "FILE_SIZE_EXCEEDED", map[string]any{"repo_id": "reports", "file_path": "big.txt", "branch": "runbox/big-read"})
		wantError(t, alice, "read_github_file", "NOT_FOUND", map[string]any{"repo_id": "reports", "file_path": "docs", "branch": "runbox/q3-report"})
	})

	t.Run("trees git itself accepts, commits racing on one branch", func(t *testing.T) {
		// Names that sort differently as git orders a tree (a folder as
		// if it ended in '/') than as plain strings.
		mustCall(t, alice, "commit_and_push_to_github", map[string]any{
			"repo_id": "reports", "branch": "runbox/race", "commit_message": "Names around a folder",
			"files": []map[string]any{
				{"path": "docs.md", "content": "x"}, {"path": "docs-old.txt", "content": "y"}, {"path": "docs/a", "content": "z"},
				{"path": "docs/a.b/c", "content": "w"}, {"path": "docs/a-b", "content": "v"},
			},
		})
		// Three commits at once to one branch: each is built on the tip it
		// fetched, the forge refuses all but one, and the others are built
		// again on the new tip. None is lost.
		var wg sync.WaitGroup
		errs := make(chan string, 3)
		for i := range 3 {
			wg.Go(func() {
				out, isErr := call(t, alice, "commit_and_push_to_github", map[string]any{
					"repo_id": "reports", "branch": "runbox/race", "commit_message": fmt.Sprintf("writer %d", i),
					"files": []map[string]any{{"path": fmt.Sprintf("race/%d.txt", i), "content": fmt.Sprint(i)}},
				})
				if isErr {
					errs <- fmt.Sprint(out)
				}
			})
		}
		wg.Wait()
		close(errs)
		for e := range errs {
			t.Error(e)
		}
		dir := t.TempDir()
		clone := strings.Replace(f.RepoURL("owner", "reports"), "http://", "http://site-admin:"+f.AdminToken+"@", 1)
		for _, args := range [][]string{
			{"clone", "--quiet", "--branch", "runbox/race", clone, dir},
			{"-C", dir, "fsck", "--strict", "--no-dangling"},
		} {
			if out, err := exec.Command("git", args...).CombinedOutput(); err != nil {
				t.Fatalf("git %s: %v\n%s", args[0], err, out)
			}
		}
		out, err := exec.Command("git", "-C", dir, "log", "--format=%s", "origin/main..HEAD").Output()
		if err != nil {
			t.Fatal(err)
		}
		if log := strings.Split(strings.TrimSpace(string(out)), "\n"); len(log) != 4 {
			t.Errorf("history of the branch: %q", out)
		}
		for i := range 3 {
			if b, err := os.ReadFile(filepath.Join(dir, "race", fmt.Sprintf("%d.txt", i))); err != nil || string(b) != fmt.Sprint(i) {
				t.Errorf("race/%d.txt: %q %v", i, b, err)
			}
		}
	})

	refusals := []struct {
		name string
		code string
		args map[string]any
	}{
		{"a repo not on the list", "INVALID_REPO", map[string]any{"repo_id": "nope", "branch": "runbox/x"}},
		{"another client's repo", "INVALID_REPO", map[string]any{"repo_id": "other", "branch": "runbox/x"}},
		{"a branch outside the patterns", "INVALID_BRANCH", map[string]any{"branch": "feature/x"}},
		{"the base branch", "INVALID_BRANCH", map[string]any{"branch": "main"}},
		{"a malformed branch", "INVALID_BRANCH", map[string]any{"branch": "runbox/../main"}},
		{"../x", "PATH_TRAVERSAL", map[string]any{"files": []map[string]any{{"path": "../x", "content": "x"}}}},
		{".git/config", "PATH_TRAVERSAL", map[string]any{"files": []map[string]any{{"path": ".git/config", "content": "x"}}}},
		{".env", "PATH_TRAVERSAL", map[string]any{"files": []map[string]any{{"path": ".env", "content": "SECRET=1"}}}},
		{"a CI workflow", "PATH_TRAVERSAL", map[string]any{"files": []map[string]any{{"path": ".github/workflows/x.yml", "content": "x"}}}},
		{"an absolute path", "PATH_TRAVERSAL", map[string]any{"files": []map[string]any{{"path": "/etc/passwd", "content": "x"}}}},
		{"an 11th file", "INVALID_ARGUMENT", map[string]any{"files": elevenFiles()}},
		{"a 600 KB file", "FILE_SIZE_EXCEEDED", map[string]any{"files": []map[string]any{{"path": "big.txt", "content": strings.Repeat("z", 600<<10)}}}},
		{"a 600 KB file in base64", "FILE_SIZE_EXCEEDED", map[string]any{"files": []map[string]any{{"path": "big.bin", "encoding": "base64",
			"content": base64.StdEncoding.EncodeToString(make([]byte, 600<<10))}}}},
		{"a long message", "INVALID_ARGUMENT", map[string]any{"commit_message": strings.Repeat("m", 201)}},
		{"a long title", "INVALID_ARGUMENT", map[string]any{"create_pr": true, "pr_title": strings.Repeat("t", 101)}},
		{"files and a conversation", "INVALID_ARGUMENT", map[string]any{"conversationId": "c", "paths": []string{"a"}}},
		{"a file and a folder of one name", "INVALID_ARGUMENT", map[string]any{"files": []map[string]any{
			{"path": "a", "content": "x"}, {"path": "a/b", "content": "y"}}}},
		{"a file where the branch has a folder", "INVALID_ARGUMENT", map[string]any{"branch": "runbox/q3-report",
			"files": []map[string]any{{"path": "docs", "content": "x"}}}},
	}
	for _, tt := range refusals {
		t.Run("refused: "+tt.name, func(t *testing.T) {
			args := map[string]any{"repo_id": "reports", "branch": "runbox/refused", "commit_message": "m",
				"files": []map[string]any{{"path": "ok.txt", "content": "x"}}}
			for k, v := range tt.args {
				args[k] = v
			}
			wantError(t, alice, "commit_and_push_to_github", tt.code, args)
			if after := f.branch(t, "reports", "runbox/refused"); after != "" {
				t.Errorf("the refused call wrote to the forge: the branch is at %s", after)
			}
		})
	}
	if tip := f.branch(t, "reports", "main"); tip != mainTip {
		t.Fatalf("main moved: %s -> %s", mainTip, tip)
	}

	t.Run("a token without push: PERMISSION_DENIED before anything is written", func(t *testing.T) {
		out := wantError(t, alice, "commit_and_push_to_github", "PERMISSION_DENIED", map[string]any{
			"repo_id": "locked", "branch": "runbox/x", "commit_message": "m", "files": []map[string]any{{"path": "a.txt", "content": "x"}},
		})
		if !strings.Contains(out["message"].(string), "may not push") {
			t.Errorf("message %q", out["message"])
		}
		if f.branch(t, "locked", "runbox/x") != "" {
			t.Error("the branch was made")
		}
		// /readyz says so too.
		if status, ready := testenv.Ready(t, svc.url); status != http.StatusServiceUnavailable || ready["git"] != "unavailable" || ready["redis"] != "ok" {
			t.Errorf("readyz %d %v", status, ready)
		}
	})

	t.Run("counted by the tier", func(t *testing.T) {
		carol := testenv.Session(t, svc.url+"/mcp", carolToken, nil)
		args := map[string]any{"repo_id": "reports", "file_path": "README.md"}
		for range 3 {
			mustCall(t, carol, "read_github_file", args)
		}
		out := wantError(t, carol, "read_github_file", "RATE_LIMIT_EXCEEDED", args)
		if out["retry_after_seconds"].(float64) < 1 {
			t.Errorf("limited without retry_after_seconds: %v", out)
		}
	})

	t.Run("the audit log records each call, contents as digests", func(t *testing.T) {
		var export, errs bytes.Buffer
		if code := app.RunAudit(context.Background(), svc.cfg.Config, []string{"export"}, &export, &errs); code != 0 {
			t.Fatalf("export: %d %s", code, errs.String())
		}
		type entry struct {
			Phase, Client, Tool, Route, Result, Error, Conversation string
			Params                                                  map[string]any
		}
		var entries []entry
		for line := range strings.SplitSeq(strings.TrimSpace(export.String()), "\n") {
			var e entry
			if err := json.Unmarshal([]byte(line), &e); err != nil {
				t.Fatal(err)
			}
			entries = append(entries, e)
		}
		ends := map[string]int{}
		var pushes []entry
		for _, e := range entries {
			if e.Tool == "commit_and_push_to_github" && e.Phase == "end" {
				ends[e.Error]++
			}
			if e.Route == "git push" && e.Phase == "start" {
				pushes = append(pushes, e)
			}
		}
		for _, tt := range refusals {
			if ends[tt.code] == 0 {
				t.Errorf("no refused call with %s in the log (%v)", tt.code, ends)
			}
		}
		if ends[""] != 3+4 || ends["PERMISSION_DENIED"] != 1 {
			t.Errorf("ends by code: %v", ends)
		}
		if len(pushes) < 4 {
			t.Fatalf("%d pushes recorded", len(pushes))
		}
		p := pushes[0]
		files := p.Params["files"].([]any)
		first := files[0].(map[string]any)
		if p.Client != "alice" || p.Params["repo_id"] != "reports" || p.Params["branch"] != "runbox/q3-report" || len(files) != 4 ||
			first["path"] != "docs/q3/report.md" || first["size"] != float64(len("# Q3\n\nRevenue grew.\n")) || len(first["sha256"].(string)) != 64 {
			t.Errorf("push entry %+v", p)
		}
		log := export.String()
		for _, secret := range []string{"Revenue grew", "north,10", "SECRET=1", f.botWrite, f.botRead, aliceToken} {
			if strings.Contains(log, secret) {
				t.Errorf("the audit log holds %q", secret)
			}
		}
		if !strings.Contains(log, `"tool":"commit_and_push_to_github"`) || !strings.Contains(log, `"path":"docs/q3/report.md"`) {
			t.Error("the tool calls' paths are not in the log")
		}
		if code := app.RunAudit(context.Background(), svc.cfg.Config, []string{"verify"}, io.Discard, &errs); code != 0 {
			t.Errorf("the chain does not verify: %s", errs.String())
		}
	})

	t.Run("tokens never leave the server", func(t *testing.T) {
		logs := svc.logs.String()
		for _, tok := range []string{f.botWrite, f.botRead} {
			if strings.Contains(logs, tok) {
				t.Errorf("the log holds a forge token")
			}
		}
		if !strings.Contains(logs, "git repository ready") || !strings.Contains(logs, "repo=locked") {
			t.Errorf("the start's checks are not logged:\n%s", logs)
		}
	})
}

func elevenFiles() []map[string]any {
	out := make([]map[string]any, 11)
	for i := range out {
		out[i] = map[string]any{"path": fmt.Sprintf("f%d.txt", i), "content": "x"}
	}
	return out
}

// TestGiteaTokenChecks: a token that may do more than push to its
// repository stops the api at start, with a line saying which and why.
func TestGiteaTokenChecks(t *testing.T) {
	f := startForge(t)
	owner := f.Token("owner", "write:repository")
	for _, tt := range []struct{ name, token, want string }{
		{"the repository owner's", owner, "its user administers the repository"},
		{"a site administrator's", f.AdminToken, "it reaches the site's admin API"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			file := testenv.WriteFile(t, "repos.yaml", fmt.Sprintf("repos:\n  reports: {forge: gitea, url: %s, token: %s, clients: [alice]}\n",
				f.RepoURL("owner", "reports"), tt.token))
			_, err := startService(t, map[string]string{"GIT_REPOS_FILE": file})
			if err == nil || !strings.Contains(err.Error(), "git repository reports: its token is refused: "+tt.want) {
				t.Fatalf("start: %v", err)
			}
			if strings.Contains(err.Error(), tt.token) || strings.Contains(err.Error(), "\n") {
				t.Errorf("the error %q holds the token or several lines", err)
			}
		})
	}
	t.Run("a revoked token", func(t *testing.T) {
		file := testenv.WriteFile(t, "repos.yaml", fmt.Sprintf("repos:\n  reports: {forge: gitea, url: %s, token: %s, clients: [alice]}\n",
			f.RepoURL("owner", "reports"), "0123456789abcdef0123456789abcdef01234567"))
		svc, err := startService(t, map[string]string{"GIT_REPOS_FILE": file})
		if err != nil {
			t.Fatal(err) // logged and shown in /readyz: one expired token does not stop the service
		}
		cs := testenv.Session(t, svc.url+"/mcp", aliceToken, nil)
		wantError(t, cs, "commit_and_push_to_github", "GITHUB_AUTH_FAILED", map[string]any{
			"repo_id": "reports", "branch": "runbox/x", "commit_message": "m", "files": []map[string]any{{"path": "a", "content": "x"}},
		})
	})
}

const daveToken = "dave-token-0123456789"

// TestGiteaHardening: against a real Gitea, through two api replicas on
// one Redis. Nothing a forge, a CI service or a development environment
// would act on when the branch is pushed is committed, whichever way it
// arrives (a list, the gateway's record, a conversation's /data, a target
// folder) and whatever its letter case or depth; nor what the operator
// forbids for the repository. A branch is its maker's: another client
// allowed on the repository cannot add to it, through either replica,
// under another repo_id of the same repository, in another letter case,
// racing for it, or after its record is lost; nor can anyone add to a
// branch made outside runbox. The gateway's record form of files is taken.
func TestGiteaHardening(t *testing.T) {
	f := startForge(t)
	f.CreateRepo("owner", "shared")
	f.AddCollaborator("owner", "shared", "bot", "write")
	redisURL := testenv.Redis(t)
	shared := f.RepoURL("owner", "shared")
	repos := testenv.WriteFile(t, "repos.yaml", fmt.Sprintf(`
repos:
  shared:
    forge: forgejo
    url: %s
    token: %s
    clients: [alice, dave]
    forbidden_paths: [deploy, "/infra/*.tf"]
  shared-again:
    forge: gitea
    url: %s
    token: %s
    clients: [dave]
`, shared, f.botWrite, strings.TrimSuffix(shared, ".git"), f.botWrite))
	env := map[string]string{"GIT_REPOS_FILE": repos, "REDIS_URL": redisURL,
		"MCP_API_TOKENS": "alice:" + aliceToken + ",bob:" + bobToken + ",dave:" + daveToken}
	one, err := startService(t, env)
	if err != nil {
		t.Fatal(err)
	}
	two, err := startService(t, env)
	if err != nil {
		t.Fatal(err)
	}
	alice := testenv.Session(t, one.url+"/mcp", aliceToken, nil)
	dave := testenv.Session(t, two.url+"/mcp", daveToken, nil)
	commit := func(branch string, files any) map[string]any {
		return map[string]any{"repo_id": "shared", "branch": branch, "commit_message": "m", "files": files}
	}
	workflow := func(path string) []map[string]any { return []map[string]any{{"path": path, "content": "on: push\n"}} }

	t.Run("CI files and forbidden_paths are refused", func(t *testing.T) {
		for _, p := range []string{
			".forgejo/workflows/ci.yml", ".Forgejo/workflows/ci.yml", "app/.forgejo/workflows/ci.yml", ".FORGEJO./workflows/ci.yml",
			".woodpecker.yml", ".woodpecker/deploy.yml", "sub/.drone.yml",
			".circleci./config.yml", "JENKINSFILE", "ci/Jenkinsfile", ".travis.yml", "azure-pipelines.yml", "bitbucket-pipelines.yml",
			".buildkite/pipeline.yml", ".devcontainer/devcontainer.json", "deploy/run.sh", "app/DEPLOY/x", "infra/main.tf",
		} {
			wantError(t, alice, "commit_and_push_to_github", "PERMISSION_DENIED", commit("runbox/ci", workflow(p)))
			wantError(t, alice, "commit_and_push_to_github", "PERMISSION_DENIED", commit("runbox/ci", map[string]any{"ok.md": "x", p: "on: push\n"}))
			wantError(t, alice, "read_github_file", "PERMISSION_DENIED", map[string]any{"repo_id": "shared", "file_path": p})
		}
		// The forges' folders are .git*, one of the gateway's own four:
		// refused as they always were, with the code its clients know.
		for _, p := range []string{".gitea/workflows/build.yaml", ".github/workflows/x.yml", "app/.GitHub./workflows/x.yml", ".gitlab-ci.yml"} {
			wantError(t, alice, "commit_and_push_to_github", "PATH_TRAVERSAL", commit("runbox/ci", workflow(p)))
			wantError(t, alice, "read_github_file", "PATH_TRAVERSAL", map[string]any{"repo_id": "shared", "file_path": p})
		}
		// From a conversation's /data: by the file's name, and by the
		// folder it is put in.
		for _, name := range []string{"Jenkinsfile", "ci.yml"} {
			mustCall(t, alice, "upload_file", map[string]any{"conversationId": "ci", "filename": name,
				"content_base64": base64.StdEncoding.EncodeToString([]byte("steps: [rm -rf /]\n"))})
		}
		for _, args := range []map[string]any{
			{"paths": []string{"Jenkinsfile"}},
			{"paths": []string{"/data/ci.yml"}, "target_dir": ".forgejo/workflows"},
			{"paths": []string{"ci.yml"}, "target_dir": "app/.Woodpecker"},
			{"paths": []string{"ci.yml"}, "target_dir": "deploy"},
		} {
			args["repo_id"], args["branch"], args["commit_message"], args["conversationId"] = "shared", "runbox/ci", "m", "ci"
			wantError(t, alice, "commit_and_push_to_github", "PERMISSION_DENIED", args)
		}
		if f.branch(t, "shared", "runbox/ci") != "" {
			t.Fatal("a refused commit made the branch")
		}
		// What only looks alike is committed.
		out := mustCall(t, alice, "commit_and_push_to_github", commit("runbox/alike", []map[string]any{
			{"path": "app/infra/main.tf", "content": "x"}, {"path": "docs/deploy.md", "content": "x"}, {"path": "docs/jenkins.md", "content": "x"},
		}))
		if len(out["files"].([]any)) != 3 {
			t.Errorf("answer %v", out)
		}
	})

	t.Run("the gateway's record form of files", func(t *testing.T) {
		out := mustCall(t, alice, "commit_and_push_to_github", map[string]any{
			"repo_id": "shared", "branch": "runbox/record", "commit_message": "From the gateway's client",
			"files": map[string]any{"src/index.js": "console.log('hi')\n", "README.md": "# shared\n"},
		})
		files := out["files"].([]any)
		if out["success"] != true || len(files) != 2 || files[0].(map[string]any)["path"] != "README.md" {
			t.Fatalf("answer %v", out)
		}
		if got := string(f.raw(t, "shared", "runbox/record", "src/index.js")); got != "console.log('hi')\n" {
			t.Errorf("src/index.js is %q", got)
		}
	})

	t.Run("a branch is its maker's", func(t *testing.T) {
		first := mustCall(t, alice, "commit_and_push_to_github", commit("runbox/alice-work", workflow("a.md")))["commit_sha"].(string)
		refused := func(cs *mcpsdk.ClientSession, args map[string]any) {
			t.Helper()
			tip := f.branch(t, "shared", "runbox/alice-work")
			out := wantError(t, cs, "commit_and_push_to_github", "PERMISSION_DENIED", args)
			if msg := out["message"].(string); strings.Contains(msg, "alice") || strings.Contains(msg, "dave") {
				t.Errorf("the message %q names a client", msg)
			}
			if now := f.branch(t, "shared", "runbox/alice-work"); now != tip {
				t.Fatalf("the branch moved: %s -> %s", tip, now)
			}
		}
		refused(dave, commit("runbox/alice-work", workflow("d.md")))
		withPR := commit("runbox/alice-work", workflow("d.md"))
		withPR["create_pr"] = true
		refused(dave, withPR)
		again := commit("runbox/alice-work", workflow("d.md"))
		again["repo_id"] = "shared-again"
		refused(dave, again)
		refused(dave, commit("runbox/Alice-Work", workflow("d.md")))
		// Its maker may always add to it, through either replica.
		alice2 := testenv.Session(t, two.url+"/mcp", aliceToken, nil)
		second := mustCall(t, alice2, "commit_and_push_to_github", commit("runbox/alice-work", workflow("b.md")))["commit_sha"].(string)
		if c := f.commit(t, "shared", second); len(c.Parents) != 1 || c.Parents[0].SHA != first {
			t.Errorf("parents %+v, want %s", c.Parents, first)
		}

		// The records lost (a Redis flushed): the tip's trailer still
		// says whose the branch is, and the record comes back.
		rdb := testenv.Client(t, redisURL)
		ctx := context.Background()
		keys := rdb.Keys(ctx, "runbox:git:*").Val()
		if len(keys) == 0 {
			t.Fatal("no branch records")
		}
		rdb.Del(ctx, keys...)
		refused(dave, commit("runbox/alice-work", workflow("d.md")))
		mustCall(t, alice, "commit_and_push_to_github", commit("runbox/alice-work", workflow("c.md")))
		if n := len(rdb.Keys(ctx, "runbox:git:*:branch:runbox/alice-work").Val()); n != 1 {
			t.Errorf("%d records of the branch after the push", n)
		}

		// A branch made outside runbox is nobody's to add to.
		f.must(t, "POST", "/repos/owner/shared/branches", map[string]any{"new_branch_name": "runbox/human", "old_branch_name": "main"})
		human := f.branch(t, "shared", "runbox/human")
		for _, cs := range []*mcpsdk.ClientSession{alice, dave} {
			wantError(t, cs, "commit_and_push_to_github", "PERMISSION_DENIED", commit("runbox/human", workflow("x.md")))
		}
		if f.branch(t, "shared", "runbox/human") != human {
			t.Error("the branch made outside runbox moved")
		}
	})

	t.Run("two clients racing for a new branch: one makes it", func(t *testing.T) {
		for round := range 3 {
			branch := fmt.Sprintf("runbox/race-%d", round)
			var wg sync.WaitGroup
			results := make([]bool, 2)
			for i, cs := range []*mcpsdk.ClientSession{alice, dave} {
				wg.Go(func() {
					out, isErr := call(t, cs, "commit_and_push_to_github", commit(branch, workflow(fmt.Sprintf("%d.md", i))))
					results[i] = !isErr
					if isErr && out["error"] != "PERMISSION_DENIED" {
						t.Errorf("%s: %v", branch, out)
					}
				})
			}
			wg.Wait()
			if results[0] == results[1] {
				t.Fatalf("%s: successes %v, want exactly one", branch, results)
			}
			winner := map[bool]string{true: "alice", false: "dave"}[results[0]]
			c := f.commit(t, "shared", f.branch(t, "shared", branch))
			if !strings.Contains(c.Commit.Message, "Runbox-Client: "+winner+"\n") {
				t.Errorf("%s: the tip %q is not %s's", branch, c.Commit.Message, winner)
			}
		}
	})
}
