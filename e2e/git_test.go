package e2e

import (
	"encoding/base64"
	"fmt"
	"strings"
	"testing"

	"github.com/runbox-dev/runbox/internal/testenv"
)

// TestGitExport: what a program wrote to /data goes to review. A run
// writes a report and a chart; commit_and_push_to_github takes them from
// the conversation by path and opens a pull request on a real Gitea, in
// one commit; read_github_file reads the report back; /readyz checks the
// token. Links out of /data and CI files a program wrote are not handed
// over.
func TestGitExport(t *testing.T) {
	g := testenv.StartGitea(t)
	g.CreateUser("owner")
	g.CreateUser("bot")
	g.CreateRepo("owner", "reports")
	g.AddCollaborator("owner", "reports", "bot", "write")
	forgeToken := g.Token("bot", "write:repository")
	repos := testenv.WriteFile(t, "repos.yaml", fmt.Sprintf(`
author: {name: runbox e2e, email: e2e@example.com}
repos:
  reports:
    forge: gitea
    url: %s
    token: %s
    allowed_branches: ["runbox/*"]
    clients: [default]
`, g.RepoURL("owner", "reports"), forgeToken))
	s := start(t, options{env: []string{"GIT_REPOS_FILE=" + repos}})
	cs := s.session(nil)

	r := runCode(t, cs, map[string]any{"language": "python", "conversationId": "weekly", "code": `
import matplotlib
matplotlib.use("Agg")
import matplotlib.pyplot as plt
visits = [120, 135, 128, 160, 171, 90, 84]
with open("/data/report.md", "w") as f:
    f.write("# Weekly visits\n\nTotal: %d\n" % sum(visits))
plt.plot(visits)
plt.savefig("/data/visits.png")
print("done")
`})
	if !r.Success || len(r.Artifacts) != 2 {
		t.Fatalf("run: %+v", r)
	}
	var pngSize int64
	for _, a := range r.Artifacts {
		if a.Name == "visits.png" {
			pngSize = a.SizeBytes
		}
	}

	var out struct {
		Success   bool   `json:"success"`
		CommitSHA string `json:"commit_sha"`
		PRURL     string `json:"pr_url"`
		Files     []struct {
			Path string `json:"path"`
			Size int64  `json:"size"`
		} `json:"files"`
	}
	res := call(t, cs, "commit_and_push_to_github", map[string]any{
		"repo_id": "reports", "branch": "runbox/weekly", "conversationId": "weekly",
		"paths": []string{"report.md", "/data/visits.png"}, "target_dir": "weekly",
		"commit_message": "Weekly visits report", "create_pr": true,
	}, &out)
	if res.IsError || !out.Success || len(out.CommitSHA) != 40 || out.PRURL == "" || len(out.Files) != 2 || out.Files[1].Size != pngSize {
		t.Fatalf("commit: %s", text(res))
	}

	var pr []struct {
		Title string `json:"title"`
		Head  struct {
			Sha string `json:"sha"`
		} `json:"head"`
	}
	g.API("GET", "/repos/owner/reports/pulls?state=open", g.AdminToken, nil, &pr)
	if len(pr) != 1 || pr[0].Title != "Weekly visits report" || pr[0].Head.Sha != out.CommitSHA {
		t.Fatalf("pull requests %+v", pr)
	}
	var commit struct {
		Files []struct {
			Filename string `json:"filename"`
		} `json:"files"`
		Parents []struct{} `json:"parents"`
	}
	g.API("GET", "/repos/owner/reports/git/commits/"+out.CommitSHA, g.AdminToken, nil, &commit)
	if len(commit.Parents) != 1 || len(commit.Files) != 2 {
		t.Errorf("not one commit of both files on main: %+v", commit)
	}

	var read struct {
		Content string `json:"content"`
		Size    int    `json:"size"`
		Binary  bool   `json:"binary"`
	}
	call(t, cs, "read_github_file", map[string]any{"repo_id": "reports", "file_path": "weekly/report.md", "branch": "runbox/weekly"}, &read)
	if read.Content != "# Weekly visits\n\nTotal: 888\n" || read.Binary {
		t.Errorf("read back %+v", read)
	}
	call(t, cs, "read_github_file", map[string]any{"repo_id": "reports", "file_path": "weekly/visits.png", "branch": "runbox/weekly"}, &read)
	if png, _ := base64.StdEncoding.DecodeString(read.Content); !read.Binary || int64(len(png)) != pngSize || !strings.HasPrefix(string(png), "\x89PNG") {
		t.Errorf("the chart read back: binary %v, %d bytes", read.Binary, len(png))
	}

	// A program cannot hand over what is outside its /data: links out,
	// and anything but a regular file, are not read.
	r = runCode(t, cs, map[string]any{"language": "bash", "conversationId": "weekly",
		"code": "ln -s /etc/passwd /data/passwd && ln -s /proc/self/environ /data/environ && mkfifo /data/fifo && echo ok"})
	if !r.Success {
		t.Fatalf("links: %+v", r)
	}
	for _, p := range []string{"passwd", "environ", "fifo"} {
		var e toolError
		res := call(t, cs, "commit_and_push_to_github", map[string]any{
			"repo_id": "reports", "branch": "runbox/escape", "conversationId": "weekly", "paths": []string{p}, "commit_message": "m",
		}, &e)
		if !res.IsError || e.Error != "NOT_FOUND" || strings.Contains(e.Message, "/etc") || strings.Contains(e.Message, s.root) {
			t.Errorf("%s: %s", p, text(res))
		}
	}
	var branch map[string]any
	if g.API("GET", "/repos/owner/reports/branches/runbox/escape", g.AdminToken, nil, &branch) != 404 {
		t.Error("a link out of /data was committed")
	}

	// What a forge or a CI service would run when the branch is pushed is
	// not handed over, whatever the program named it and wherever it is
	// put.
	r = runCode(t, cs, map[string]any{"language": "bash", "conversationId": "weekly", "code": "mkdir -p /data/.forgejo/workflows /data/ci " +
		"&& printf 'on: push\\njobs: {x: {steps: [{run: env}]}}\\n' > /data/.forgejo/workflows/ci.yml " +
		"&& cp /data/.forgejo/workflows/ci.yml /data/Jenkinsfile && cp /data/Jenkinsfile /data/ci/.Woodpecker.yml && echo ok"})
	if !r.Success {
		t.Fatalf("CI files: %+v", r)
	}
	for _, args := range []map[string]any{
		{"paths": []string{".forgejo/workflows/ci.yml"}},
		{"paths": []string{"/data/Jenkinsfile"}},
		{"paths": []string{"/mnt/data/ci/.Woodpecker.yml"}},
		{"paths": []string{"report.md", "Jenkinsfile"}},
		{"paths": []string{"report.md"}, "target_dir": "app/.CircleCI"},
	} {
		args["repo_id"], args["branch"], args["conversationId"], args["commit_message"] = "reports", "runbox/ci", "weekly", "m"
		var e toolError
		if res := call(t, cs, "commit_and_push_to_github", args, &e); !res.IsError || e.Error != "PERMISSION_DENIED" {
			t.Errorf("%v: %s", args, text(res))
		}
	}
	if g.API("GET", "/repos/owner/reports/branches/runbox/ci", g.AdminToken, nil, &branch) != 404 {
		t.Error("a CI file was committed")
	}

	if _, ready := testenv.Ready(t, s.url); ready["git"] != "ok" {
		t.Errorf("readyz %v", ready)
	}
	for _, p := range s.procs {
		if strings.Contains(p.out.String(), forgeToken) {
			t.Errorf("the %s log holds the forge's token", p.name)
		}
	}
}
