package testenv

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// GiteaVersion is the Gitea `make test-deps` builds (deploy/gitea).
const GiteaVersion = "1.26.0"

// Gitea is a real Gitea (SQLite, loopback, a fresh data folder) started
// for a test, with a site administrator for the test's own setup.
type Gitea struct {
	// URL is the server's root: http://127.0.0.1:<port>/.
	URL string
	// AdminToken is the site administrator's (all scopes): for setting
	// up and inspecting, never for the code under test.
	AdminToken string

	t      testing.TB
	bin    string
	dir    string
	config string
}

// StartGitea starts Gitea for the test; it stops when the test ends. A
// machine without it fails the test with the command that installs it:
// integration tests must not skip in CI.
func StartGitea(t testing.TB) *Gitea {
	t.Helper()
	bin := giteaBinary(t)
	src := giteaSource(t)
	g := &Gitea{t: t, bin: bin, dir: t.TempDir()}
	port := FreePort(t)
	g.URL = fmt.Sprintf("http://127.0.0.1:%d/", port)
	g.config = filepath.Join(g.dir, "app.ini")
	ini := fmt.Sprintf(giteaConfig, g.dir, port, g.URL, currentUser(), src)
	if err := os.WriteFile(g.config, []byte(ini), 0o600); err != nil {
		t.Fatal(err)
	}
	g.cli("migrate")
	g.createAdmin()
	g.serve()
	return g
}

// giteaSource returns the folder of Gitea's module source: without its
// bindata tag, Gitea reads its locales and templates from there.
func giteaSource(t testing.TB) string {
	t.Helper()
	list := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "code.gitea.io/gitea")
	list.Dir = filepath.Join(RepoRoot(t), "deploy", "gitea")
	src, err := list.Output()
	if err != nil || strings.TrimSpace(string(src)) == "" {
		t.Fatalf("the source of Gitea's module is not in the module cache (make test-deps fetches it): %v", err)
	}
	return strings.TrimSpace(string(src))
}

// giteaConfig is Gitea's app.ini: its folder (1), port (2), root URL (3),
// user (4) and module source (5).
const giteaConfig = `APP_NAME = runbox-test
RUN_MODE = prod
RUN_USER = %[4]s
WORK_PATH = %[1]s
I_AM_BEING_UNSAFE_RUNNING_AS_ROOT = true

[server]
PROTOCOL = http
HTTP_ADDR = 127.0.0.1
HTTP_PORT = %[2]d
ROOT_URL = %[3]s
DISABLE_SSH = true
OFFLINE_MODE = true
LFS_START_SERVER = false
APP_DATA_PATH = %[1]s/data
STATIC_ROOT_PATH = %[5]s

[database]
DB_TYPE = sqlite3
PATH = %[1]s/data/gitea.db

[repository]
ROOT = %[1]s/repos

[security]
INSTALL_LOCK = true
SECRET_KEY = runbox-test-secret-key-0123456789

[service]
DISABLE_REGISTRATION = true

[log]
MODE = console
LEVEL = warn

[indexer]
REPO_INDEXER_ENABLED = false

[cron]
ENABLED = false

[queue]
TYPE = channel

[mailer]
ENABLED = false

[session]
PROVIDER = memory

[cache]
ADAPTER = memory
`

// createAdmin makes the site administrator and its token (AdminToken).
func (g *Gitea) createAdmin() {
	t := g.t
	t.Helper()
	g.cli("admin", "user", "create", "--admin", "--username", "site-admin", "--password", "site-admin-password-0",
		"--email", "site-admin@example.com", "--must-change-password=false")
	printed := g.cli("admin", "user", "generate-access-token", "--username", "site-admin",
		"--token-name", "setup", "--scopes", "all", "--raw")
	// Gitea's log lines share its standard output, written by another
	// goroutine: the token is the line that is one, wherever it is.
	if g.AdminToken = giteaToken.FindString(printed); g.AdminToken == "" {
		t.Fatalf("gitea generate-access-token printed no token: %s", printed)
	}
}

// serve starts Gitea's web server, stopped when the test ends, and waits
// until it answers (at most a minute).
func (g *Gitea) serve() {
	t := g.t
	t.Helper()
	var out bytes.Buffer
	cmd := exec.Command(g.bin, "--config", g.config, "--work-path", g.dir, "web")
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatalf("start gitea: %v", err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(os.Interrupt)
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			_ = cmd.Process.Kill()
			<-done
		}
		if t.Failed() {
			t.Logf("--- gitea ---\n%s", out.String())
		}
	})
	deadline := time.Now().Add(60 * time.Second)
	for {
		resp, err := http.Get(g.URL + "api/v1/version")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("gitea did not come up: %s", out.String())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func giteaBinary(t testing.TB) string {
	t.Helper()
	bin, err := exec.LookPath("gitea")
	if err != nil {
		gopath, _ := exec.Command("go", "env", "GOPATH").Output()
		bin = filepath.Join(strings.TrimSpace(string(gopath)), "bin", "gitea")
	}
	v, err := exec.Command(bin, "--version").Output()
	if err != nil || !strings.Contains(string(v), "version "+GiteaVersion+" ") {
		t.Fatalf("Gitea %s is not installed (found: %q): run `make test-deps` (or deploy/gitea/install.sh): the git tests run against it",
			GiteaVersion, strings.TrimSpace(string(v)))
	}
	return bin
}

func currentUser() string {
	if u := os.Getenv("USER"); u != "" {
		return u
	}
	out, _ := exec.Command("id", "-un").Output()
	return strings.TrimSpace(string(out))
}

// giteaToken is an access token as Gitea prints it, alone on its line.
var giteaToken = regexp.MustCompile(`(?m)^[0-9a-f]{40}$`)

// cli runs a gitea command against the test's server and returns its
// standard output.
func (g *Gitea) cli(args ...string) string {
	g.t.Helper()
	cmd := exec.Command(g.bin, append([]string{"--config", g.config, "--work-path", g.dir}, args...)...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		g.t.Fatalf("gitea %s: %v\n%s%s", args[0], err, stdout.String(), stderr.String())
	}
	return stdout.String()
}

// API calls Gitea's REST API (path after /api/v1) with a token and
// decodes the answer into out (when not nil); it returns the status.
func (g *Gitea) API(method, path, token string, body, out any) int {
	g.t.Helper()
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			g.t.Fatal(err)
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(context.Background(), method, g.URL+"api/v1"+path, rd)
	if err != nil {
		g.t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	if token != "" {
		req.Header.Set("Authorization", "token "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		g.t.Fatalf("gitea %s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if out != nil && resp.StatusCode < 300 {
		if err := json.Unmarshal(b, out); err != nil {
			g.t.Fatalf("gitea %s %s: %v: %s", method, path, err, b)
		}
	}
	return resp.StatusCode
}

// must is API that fails the test on anything but a 2xx answer.
func (g *Gitea) must(method, path, token string, body, out any) {
	g.t.Helper()
	if status := g.API(method, path, token, body, out); status >= 300 {
		g.t.Fatalf("gitea %s %s: status %d", method, path, status)
	}
}

// CreateUser makes a user (not an administrator).
func (g *Gitea) CreateUser(name string) {
	g.t.Helper()
	g.must("POST", "/admin/users", g.AdminToken, map[string]any{
		"username": name, "email": name + "@example.com", "password": name + "-password-0123",
		"must_change_password": false,
	}, nil)
}

// Token makes an access token of a user with the scopes given
// (write:repository, read:repository, all, …), as the user (its basic
// auth), as a person does in the web UI.
func (g *Gitea) Token(user string, scopes ...string) string {
	g.t.Helper()
	var tok struct {
		SHA1 string `json:"sha1"`
	}
	req, err := http.NewRequest("POST", g.URL+"api/v1/users/"+user+"/tokens", strings.NewReader(fmt.Sprintf(
		`{"name": "t%d", "scopes": %s}`, time.Now().UnixNano(), mustJSON(g.t, scopes))))
	if err != nil {
		g.t.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.SetBasicAuth(user, user+"-password-0123")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		g.t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusCreated || json.Unmarshal(b, &tok) != nil || tok.SHA1 == "" {
		g.t.Fatalf("token of %s: %d %s", user, resp.StatusCode, b)
	}
	return tok.SHA1
}

func mustJSON(t testing.TB, v any) string {
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// CreateRepo makes the repository owner/name with one commit on main (a
// README), through the API as the owner.
func (g *Gitea) CreateRepo(owner, name string) {
	g.t.Helper()
	g.must("POST", "/admin/users/"+owner+"/repos", g.AdminToken, map[string]any{
		"name": name, "auto_init": true, "default_branch": "main", "private": true, "readme": "Default",
	}, nil)
}

// AddCollaborator gives user access to owner/repo: "read", "write" or
// "admin".
func (g *Gitea) AddCollaborator(owner, repo, user, permission string) {
	g.t.Helper()
	g.must("PUT", "/repos/"+owner+"/"+repo+"/collaborators/"+user, g.AdminToken, map[string]any{"permission": permission}, nil)
}

// RepoURL is the repository's address as git clones it.
func (g *Gitea) RepoURL(owner, repo string) string { return g.URL + owner + "/" + repo + ".git" }
