package gitexport_test

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/runbox-dev/runbox"
	"github.com/runbox-dev/runbox/internal/auth"
	"github.com/runbox-dev/runbox/internal/clients"
	"github.com/runbox-dev/runbox/internal/gitexport"
	"github.com/runbox-dev/runbox/internal/mcp"
	"github.com/runbox-dev/runbox/internal/store"
	"github.com/runbox-dev/runbox/internal/testenv"
)

// fakeGitHub answers GitHub's REST API for one repository with the
// request and response shapes GitHub documents
// (docs.github.com/rest: repos, pulls, contents, rate limits), and
// records what it was sent. It stands for api.github.com only: git
// itself (the push) goes to a real Gitea, which speaks the same smart
// HTTP protocol as github.com.
type fakeGitHub struct {
	*httptest.Server
	mu       sync.Mutex
	requests []recorded
	// What the next answers say.
	scopes     *string // X-OAuth-Scopes; nil: a fine-grained token (no header)
	push       bool
	prExists   bool
	failWith   int // 401, 403 (rate limit), 429 …
	files      map[string]string
	tokenSeen  string
	expiration string
}

type recorded struct {
	Method, Path, Query string
	Body                map[string]any
}

const ghDocs = "https://docs.github.com/rest"

func newFakeGitHub(t *testing.T) *fakeGitHub {
	f := &fakeGitHub{push: true, files: map[string]string{}}
	f.Server = httptest.NewServer(http.HandlerFunc(f.serve))
	t.Cleanup(f.Close)
	return f
}

func (f *fakeGitHub) serve(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	rec := recorded{Method: r.Method, Path: r.URL.Path, Query: r.URL.RawQuery}
	if b, _ := io.ReadAll(r.Body); len(b) > 0 {
		_ = json.Unmarshal(b, &rec.Body)
	}
	f.requests = append(f.requests, rec)
	f.tokenSeen = r.Header.Get("Authorization")
	w.Header().Set("Content-Type", "application/json; charset=utf-8")
	w.Header().Set("X-GitHub-Api-Version-Selected", "2022-11-28")
	if f.scopes != nil {
		w.Header().Set("X-OAuth-Scopes", *f.scopes)
		w.Header().Set("X-Accepted-OAuth-Scopes", "repo")
	}
	if f.expiration != "" {
		w.Header().Set("GitHub-Authentication-Token-Expiration", f.expiration)
	}
	reply := func(status int, body string) {
		w.WriteHeader(status)
		_, _ = io.WriteString(w, body)
	}
	switch f.failWith {
	case http.StatusUnauthorized:
		reply(401, `{"message":"Bad credentials","documentation_url":"`+ghDocs+`","status":"401"}`)
		return
	case http.StatusForbidden: // the primary rate limit, as GitHub says it
		w.Header().Set("X-RateLimit-Limit", "5000")
		w.Header().Set("X-RateLimit-Remaining", "0")
		w.Header().Set("X-RateLimit-Used", "5000")
		w.Header().Set("X-RateLimit-Reset", fmt.Sprint(time.Now().Add(90*time.Second).Unix()))
		w.Header().Set("X-RateLimit-Resource", "core")
		reply(403, `{"message":"API rate limit exceeded for user ID 1.","documentation_url":"`+ghDocs+`/overview/rate-limits-for-the-rest-api"}`)
		return
	case http.StatusTooManyRequests: // a secondary rate limit
		w.Header().Set("Retry-After", "42")
		reply(403, `{"message":"You have exceeded a secondary rate limit. Please wait a few minutes before you try again.","documentation_url":"https://docs.github.com/free-pro-team@latest/rest/overview/rate-limits-for-the-rest-api#about-secondary-rate-limits"}`)
		return
	}
	notFound := `{"message":"Not Found","documentation_url":"` + ghDocs + `","status":"404"}`
	switch {
	case r.Method == "GET" && r.URL.Path == "/repos/owner/reports":
		reply(200, fmt.Sprintf(`{"id":1296269,"node_id":"MDEwOlJlcG9zaXRvcnkxMjk2MjY5","name":"reports","full_name":"owner/reports",
			"private":true,"owner":{"login":"owner","id":1,"type":"User"},"html_url":"https://github.com/owner/reports",
			"default_branch":"main","visibility":"private","permissions":{"admin":false,"maintain":false,"push":%t,"triage":true,"pull":true}}`, f.push))
	case r.Method == "POST" && r.URL.Path == "/repos/owner/reports/pulls":
		if f.prExists {
			reply(422, `{"message":"Validation Failed","errors":[{"resource":"PullRequest","code":"custom","message":"A pull request already exists for owner:`+
				fmt.Sprint(rec.Body["head"])+`."}],"documentation_url":"https://docs.github.com/rest/pulls/pulls#create-a-pull-request","status":"422"}`)
			return
		}
		f.prExists = true
		reply(201, `{"url":"https://api.github.com/repos/owner/reports/pulls/1347","id":1,"number":1347,"state":"open",
			"html_url":"https://github.com/owner/reports/pull/1347","title":`+mustJSON(rec.Body["title"])+`,
			"head":{"ref":`+mustJSON(rec.Body["head"])+`},"base":{"ref":`+mustJSON(rec.Body["base"])+`}}`)
	case r.Method == "GET" && r.URL.Path == "/repos/owner/reports/pulls":
		reply(200, `[{"url":"https://api.github.com/repos/owner/reports/pulls/1347","number":1347,"state":"open",
			"html_url":"https://github.com/owner/reports/pull/1347"}]`)
	case r.Method == "GET" && strings.HasPrefix(r.URL.Path, "/repos/owner/reports/contents/"):
		p := strings.TrimPrefix(r.URL.Path, "/repos/owner/reports/contents/")
		switch content, ok := f.files[p]; {
		case p == "docs":
			reply(200, `[{"type":"file","size":3,"name":"a.md","path":"docs/a.md","sha":"e69de29bb2d1d6434b8b29ae775ad8c2e48c5391"}]`)
		case p == "huge.bin":
			// 1–100 MB: GitHub sends no content and the encoding "none".
			reply(200, `{"type":"file","encoding":"none","size":5000000,"name":"huge.bin","path":"huge.bin","content":"",
				"sha":"3d21ec53a331a6f037a91c368710b99387d012c1"}`)
		case ok:
			// GitHub wraps the base64 at 60 characters.
			enc := base64.StdEncoding.EncodeToString([]byte(content))
			var wrapped strings.Builder
			for len(enc) > 60 {
				wrapped.WriteString(enc[:60] + "\n")
				enc = enc[60:]
			}
			wrapped.WriteString(enc + "\n")
			reply(200, fmt.Sprintf(`{"type":"file","encoding":"base64","size":%d,"name":%q,"path":%q,"content":%s,
				"sha":"3d21ec53a331a6f037a91c368710b99387d012c1","html_url":"https://github.com/owner/reports/blob/main/%s"}`,
				len(content), p, p, mustJSON(wrapped.String()), p))
		default:
			reply(404, notFound)
		}
	default:
		reply(404, notFound)
	}
}

func mustJSON(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

func (f *fakeGitHub) set(fn func(f *fakeGitHub)) {
	f.mu.Lock()
	defer f.mu.Unlock()
	fn(f)
}

func (f *fakeGitHub) last() recorded {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.requests[len(f.requests)-1]
}

// TestGitHub: the GitHub adapter. Its pushes go over git's HTTP protocol
// to a real Gitea (what github.com speaks too); its REST calls go to
// fakeGitHub, which answers as GitHub documents. Not verified against a
// live GitHub (docs/git.md says so).
func TestGitHub(t *testing.T) {
	forge := startForge(t)
	gh := newFakeGitHub(t)
	_, redisURL := testenv.Miniredis(t)
	owners := store.New(store.NewConn(testenv.Client(t, redisURL)))
	newService := func(token string) *gitexport.Service {
		t.Helper()
		svc, err := gitexport.New(gitexport.Options{Owners: owners, Git: &gitexport.Git{
			Author: gitexport.DefaultSignature, Committer: gitexport.DefaultSignature,
			Repos: map[string]*gitexport.Repo{"reports": {
				ID: "reports", Forge: gitexport.ForgeGitHub, URL: forge.RepoURL("owner", "reports"), Owner: "owner", Name: "reports",
				APIURL: gh.URL + "/", Token: gitexport.Secret(token), AllowedBranches: []string{"runbox/*"},
				BaseBranch: "main", Clients: []string{"alice"},
			}},
		}})
		if err != nil {
			t.Fatal(err)
		}
		return svc
	}
	ctx := auth.WithClient(context.Background(), clients.Client{Name: "alice"})
	wantCode := func(t *testing.T, err error, code string) {
		t.Helper()
		if runbox.ErrorCode(err) != code {
			t.Fatalf("error %v (%s), want %s", err, runbox.ErrorCode(err), code)
		}
		msg := runbox.ErrorMessage(err)
		for _, leak := range []string{forge.botWrite, forge.botRead, "Bad credentials", "API rate limit", "127.0.0.1"} {
			if strings.Contains(msg, leak) {
				t.Errorf("the client's message %q holds %q", msg, leak)
			}
		}
	}

	t.Run("a fine-grained token that may push: commit, pull request, read", func(t *testing.T) {
		svc := newService(forge.botWrite)
		gh.set(func(f *fakeGitHub) {
			f.expiration = time.Now().Add(30 * 24 * time.Hour).UTC().Format("2006-01-02 15:04:05 MST")
		})
		if err := svc.Start(ctx); err != nil {
			t.Fatal(err)
		}
		if gh.tokenSeen != "Bearer "+forge.botWrite {
			t.Errorf("the REST calls sent %q", gh.tokenSeen)
		}
		out, err := svc.Commit(ctx, gitexport.CommitInput{
			RepoID: "reports", Branch: "runbox/gh-1", CommitMessage: "Add the figures\n\nFrom the analysis.", CreatePR: true,
			Files: mcp.Files{{Path: "figures/a.csv", Content: "a,1\n"}, {Path: "figures/b.csv", Content: "b,2\n"}},
		})
		if err != nil {
			t.Fatal(err)
		}
		if out.PRURL != "https://github.com/owner/reports/pull/1347" || forge.branch(t, "reports", "runbox/gh-1") != out.CommitSHA {
			t.Fatalf("answer %+v, branch at %s", out, forge.branch(t, "reports", "runbox/gh-1"))
		}
		pr := gh.last()
		if pr.Method != "POST" || pr.Path != "/repos/owner/reports/pulls" || pr.Body["head"] != "runbox/gh-1" || pr.Body["base"] != "main" ||
			pr.Body["title"] != "Add the figures" || !strings.Contains(fmt.Sprint(pr.Body["body"]), "figures/b.csv") {
			t.Errorf("pull request sent as %+v", pr)
		}
		// Once more on the same branch: GitHub answers 422 "already
		// exists", and the open one is found.
		again, err := svc.Commit(ctx, gitexport.CommitInput{
			RepoID: "reports", Branch: "runbox/gh-1", CommitMessage: "More", CreatePR: true, PRTitle: "ignored, one is open",
			Files: mcp.Files{{Path: "figures/c.csv", Content: "c,3\n"}},
		})
		if err != nil || again.PRURL != out.PRURL {
			t.Fatalf("second commit: %+v %v", again, err)
		}
		if l := gh.last(); l.Method != "GET" || l.Path != "/repos/owner/reports/pulls" ||
			!strings.Contains(l.Query, "head=owner%3Arunbox%2Fgh-1") || !strings.Contains(l.Query, "state=open") || !strings.Contains(l.Query, "base=main") {
			t.Errorf("open pull requests asked as %+v", l)
		}

		gh.set(func(f *fakeGitHub) { f.files["notes/read.md"] = strings.Repeat("line of text\n", 20) })
		r, err := svc.Read(ctx, gitexport.ReadInput{RepoID: "reports", FilePath: "notes/read.md", Branch: "runbox/gh-1"})
		if err != nil || r.Content != strings.Repeat("line of text\n", 20) || r.Binary || r.Size != 260 {
			t.Fatalf("read %+v %v", r, err)
		}
		if l := gh.last(); l.Path != "/repos/owner/reports/contents/notes/read.md" || l.Query != "ref=runbox%2Fgh-1" {
			t.Errorf("contents asked as %+v", l)
		}
		gh.set(func(f *fakeGitHub) { f.files["logo.png"] = "\x89PNG\r\n\x1a\n\x00\x01" })
		if r, err := svc.Read(ctx, gitexport.ReadInput{RepoID: "reports", FilePath: "logo.png"}); err != nil || !r.Binary || r.Encoding != "base64" || r.Branch != "main" {
			t.Errorf("binary read %+v %v", r, err)
		}
		_, err = svc.Read(ctx, gitexport.ReadInput{RepoID: "reports", FilePath: "docs"})
		wantCode(t, err, runbox.ENotFound)
		_, err = svc.Read(ctx, gitexport.ReadInput{RepoID: "reports", FilePath: "missing.md"})
		wantCode(t, err, runbox.ENotFound)
		_, err = svc.Read(ctx, gitexport.ReadInput{RepoID: "reports", FilePath: "huge.bin"})
		wantCode(t, err, runbox.EFileSizeExceeded)
	})

	t.Run("a classic token with broad scopes is refused at start", func(t *testing.T) {
		scopes := "repo, workflow, read:org"
		gh.set(func(f *fakeGitHub) { f.scopes = &scopes })
		defer gh.set(func(f *fakeGitHub) { f.scopes = nil })
		svc := newService(forge.botWrite)
		err := svc.Start(ctx)
		var broad *gitexport.TooBroadError
		if !errors.As(err, &broad) || !strings.Contains(err.Error(), "classic GitHub token with the scopes repo, workflow, which") ||
			!strings.Contains(err.Error(), "fine-grained token limited to owner/reports") {
			t.Fatalf("start: %v", err)
		}
		if strings.Contains(err.Error(), forge.botWrite) {
			t.Error("the error holds the token")
		}
		// Nor is it used by a call made anyway.
		_, err = svc.Commit(ctx, gitexport.CommitInput{RepoID: "reports", Branch: "runbox/gh-2", CommitMessage: "m",
			Files: mcp.Files{{Path: "x", Content: "x"}}})
		wantCode(t, err, runbox.EGitHubAuthFailed)
		if forge.branch(t, "reports", "runbox/gh-2") != "" {
			t.Error("a refused token pushed")
		}
		// A classic token without scopes says so with an empty header,
		// and is not refused for breadth (it then fails the push check).
		none := ""
		gh.set(func(f *fakeGitHub) { f.scopes = &none })
		if err := newService(forge.botWrite).Start(ctx); err != nil {
			t.Errorf("a classic token without broad scopes: %v", err)
		}
	})

	t.Run("a token that may not push", func(t *testing.T) {
		// The REST answer says the user may push, but the token itself may
		// not (a fine-grained token without Contents: write): the
		// receive-pack advertisement tells.
		svc := newService(forge.botRead)
		if err := svc.Start(ctx); err != nil {
			t.Fatal(err) // not refused for breadth: only unusable for pushes
		}
		_, err := svc.Commit(ctx, gitexport.CommitInput{RepoID: "reports", Branch: "runbox/gh-3", CommitMessage: "m",
			Files: mcp.Files{{Path: "x", Content: "x"}}})
		wantCode(t, err, runbox.EPermissionDenied)
		if forge.branch(t, "reports", "runbox/gh-3") != "" {
			t.Error("the branch was made")
		}
		if err := svc.Ready(ctx); err == nil || !strings.Contains(err.Error(), "may not push") {
			t.Errorf("ready: %v", err)
		}
		// Where GitHub says the user may not push, that is enough.
		gh.set(func(f *fakeGitHub) { f.push = false })
		defer gh.set(func(f *fakeGitHub) { f.push = true })
		_, err = newService(forge.botWrite).Commit(ctx, gitexport.CommitInput{RepoID: "reports", Branch: "runbox/gh-3", CommitMessage: "m",
			Files: mcp.Files{{Path: "x", Content: "x"}}})
		wantCode(t, err, runbox.EPermissionDenied)
	})

	t.Run("GitHub's refusals as the gateway's codes", func(t *testing.T) {
		for status, code := range map[int]string{
			http.StatusUnauthorized:    runbox.EGitHubAuthFailed,
			http.StatusForbidden:       runbox.ERateLimitExceeded,
			http.StatusTooManyRequests: runbox.ERateLimitExceeded,
		} {
			gh.set(func(f *fakeGitHub) { f.failWith = status })
			svc := newService(forge.botWrite)
			_, err := svc.Read(ctx, gitexport.ReadInput{RepoID: "reports", FilePath: "README.md"})
			wantCode(t, err, code)
			if code == runbox.ERateLimitExceeded && runbox.RetryAfterSeconds(err) < 30 {
				t.Errorf("status %d: retry after %ds", status, runbox.RetryAfterSeconds(err))
			}
		}
		gh.set(func(f *fakeGitHub) { f.failWith = 0 })
	})
}
