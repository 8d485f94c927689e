package gitexport

import (
	"bytes"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

const gitToken = "tok_0123456789abcdef0123"

func writeFile(t *testing.T, name, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func TestGitReposFile(t *testing.T) {
	tokFile := writeFile(t, "tok", "  "+gitToken+"-file\n")
	file := writeFile(t, "repos.yaml", `
author: {name: Runbox Bot, email: bot@example.com}
repos:
  reports:
    forge: github
    url: https://github.com/acme/reports.git
    token: `+gitToken+`
    allowed_branches: ["runbox/*", "agent-?"]
    base_branch: develop
    clients: [alice, bob]
    forbidden_paths: [deploy, "/infra/*.tf"]
  internal:
    forge: forgejo
    url: https://code.example.com/forge/team/internal
    token_file: `+tokFile+`
    clients: [alice]
  ghe:
    forge: github
    url: https://ghe.example.com/acme/tool
    token: `+gitToken+`
    clients: [bob]
`)
	g, err := LoadGit(file, "", map[string]bool{"alice": true, "bob": true})
	if err != nil {
		t.Fatal(err)
	}
	if g.Author != (Signature{"Runbox Bot", "bot@example.com"}) || g.Committer != g.Author {
		t.Errorf("signatures %+v %+v", g.Author, g.Committer)
	}
	r := g.Repos["reports"]
	if r.Forge != ForgeGitHub || r.Owner != "acme" || r.Name != "reports" || r.APIURL != "https://api.github.com/" ||
		r.BaseBranch != "develop" || r.Token.Reveal() != gitToken || strings.Join(r.Clients, ",") != "alice,bob" ||
		strings.Join(r.AllowedBranches, ",") != "runbox/*,agent-?" || r.URL != "https://github.com/acme/reports.git" {
		t.Errorf("reports: %+v", r)
	}
	in := g.Repos["internal"]
	if in.Forge != ForgeGitea || in.APIURL != "https://code.example.com/forge/" || in.Owner != "team" || in.Name != "internal" ||
		in.BaseBranch != "main" || strings.Join(in.AllowedBranches, ",") != "runbox/*" || in.Token.Reveal() != gitToken+"-file" {
		t.Errorf("internal: %+v", in)
	}
	if fp := fmt.Sprint(r.ForbiddenPaths); fp != "[deploy /infra/*.tf]" || in.ForbiddenPaths != nil {
		t.Errorf("forbidden_paths %s, %v", fp, in.ForbiddenPaths)
	}
	if ghe := g.Repos["ghe"]; ghe.APIURL != "https://ghe.example.com/api/v3/" {
		t.Errorf("GitHub Enterprise API: %q", ghe.APIURL)
	}
}

func TestGitAPIURL(t *testing.T) {
	file := writeFile(t, "repos.yaml", `
repos:
  a: {forge: github, url: "http://127.0.0.1:3000/o/a.git", token: `+gitToken+`, clients: [default]}
  b: {forge: gitea, url: "http://127.0.0.1:3000/o/b.git", token: `+gitToken+`, clients: [default]}
`)
	for v, want := range map[string][2]string{
		"":                           {"http://127.0.0.1:3000/api/v3/", "http://127.0.0.1:3000/"},
		"http://127.0.0.1:9/api/v1/": {"http://127.0.0.1:9/", "http://127.0.0.1:9/"},
		"github=https://gh.example.com/api/v3,gitea=http://localhost:8/api/v1": {"https://gh.example.com/api/v3/", "http://localhost:8/"},
	} {
		g, err := LoadGit(file, v, map[string]bool{"default": true})
		if err != nil {
			t.Fatalf("GIT_API_URL=%q: %v", v, err)
		}
		if got := [2]string{g.Repos["a"].APIURL, g.Repos["b"].APIURL}; got != want {
			t.Errorf("GIT_API_URL=%q: %v, want %v", v, got, want)
		}
	}
	for _, bad := range []string{"ftp://x", "github=", "svn=https://x", "http://remote.example.com/api"} {
		if _, err := LoadGit(file, bad, map[string]bool{"default": true}); err == nil || !strings.Contains(err.Error(), "GIT_API_URL") {
			t.Errorf("GIT_API_URL=%q: %v", bad, err)
		}
	}
}

func TestGitReposFileErrors(t *testing.T) {
	repo := func(fields string) string {
		return "repos:\n  r:\n" + fields
	}
	base := "    forge: gitea\n    url: https://git.example.com/o/r.git\n    clients: [alice]\n"
	tests := []struct{ name, body, want string }{
		{"no repos", "repos: {}\n", "lists no repos"},
		{"unknown field", repo(base + "    token: " + gitToken + "\n    tokens: x\n"), "unknown field"},
		{"no token", repo(base), "exactly one of token and token_file"},
		{"both tokens", repo(base + "    token: " + gitToken + "\n    token_file: /x\n"), "exactly one of token and token_file"},
		{"short token", repo(base + "    token: short\n"), "at least 16"},
		{"missing token file", repo(base + "    token_file: /nonexistent/token\n"), "token_file cannot be read"},
		{"bad forge", repo("    forge: gitlab\n    url: https://x.example.com/o/r\n    token: " + gitToken + "\n    clients: [alice]\n"), "forge must be"},
		{"plain http", repo("    forge: gitea\n    url: http://git.example.com/o/r\n    token: " + gitToken + "\n    clients: [alice]\n"), "https://"},
		{"credentials in url", repo("    forge: gitea\n    url: https://u:" + gitToken + "@git.example.com/o/r\n    token: " + gitToken + "\n    clients: [alice]\n"), "no credentials"},
		{"no owner", repo("    forge: gitea\n    url: https://git.example.com/r\n    token: " + gitToken + "\n    clients: [alice]\n"), "must name the repository"},
		{"no clients", repo("    forge: gitea\n    url: https://git.example.com/o/r\n    token: " + gitToken + "\n"), "clients must name"},
		{"unknown client", repo("    forge: gitea\n    url: https://git.example.com/o/r\n    token: " + gitToken + "\n    clients: [mallory]\n"), `no token belongs to a client "mallory"`},
		{"bad glob", repo(base + "    token: " + gitToken + "\n    allowed_branches: [\"[\"]\n"), "not a valid pattern"},
		{"bad forbidden path", repo(base + "    token: " + gitToken + "\n    forbidden_paths: [\"a/../b\"]\n"), `forbidden_paths: "a/../b"`},
		{"bad forbidden glob", repo(base + "    token: " + gitToken + "\n    forbidden_paths: [\"[\"]\n"), "forbidden_paths"},
		{"bad base", repo(base + "    token: " + gitToken + "\n    base_branch: a..b\n"), "base_branch"},
		{"bad id", "repos:\n  \"a b\":\n" + base + "    token: " + gitToken + "\n", "the id must be"},
		{"bad author", "author: {name: x, email: nope}\n" + repo(base+"    token: "+gitToken+"\n"), "author.email"},
		{"syntax error on the token's line", repo(base + "    token: " + gitToken + ": [\n"), "GIT_REPOS_FILE"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			file := writeFile(t, "repos.yaml", tt.body)
			_, err := LoadGit(file, "", map[string]bool{"alice": true})
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Fatalf("error %v, want one saying %q", err, tt.want)
			}
			if strings.Contains(err.Error(), gitToken) || strings.Contains(err.Error(), "\n") {
				t.Errorf("error %q holds the token or more than one line", err)
			}
		})
	}
}

// TestSecretNeverPrints: however a token is printed, logged or encoded,
// what comes out is "[redacted]".
func TestSecretNeverPrints(t *testing.T) {
	r := &Repo{ID: "r", Token: Secret(gitToken)}
	var logged bytes.Buffer
	slog.New(slog.NewJSONHandler(&logged, nil)).Info("repo", "repo", r, "token", r.Token)
	slog.New(slog.NewTextHandler(&logged, nil)).Info("repo", "token", r.Token)
	j, _ := json.Marshal(r)
	out := fmt.Sprintf("%v %+v %#v %s %q %x", r, r, r, r.Token, r.Token, r.Token) + string(j) + logged.String()
	if strings.Contains(out, gitToken) || strings.Contains(out, fmt.Sprintf("%x", gitToken)) {
		t.Fatalf("the token leaked: %s", out)
	}
	if r.Token.Reveal() != gitToken {
		t.Fatal("Reveal")
	}
}
