package rules

import (
	"errors"
	"path"
	"strings"
	"testing"
	"unicode"
)

func TestPath(t *testing.T) {
	tests := []struct {
		path string
		ok   bool
	}{
		{"report.md", true},
		{"docs/2026/summary.csv", true},
		{"src/app_v2-final.py", true},
		{"environment.yml", true}, // .env is a prefix of a part, not of any word
		{"gitlog.txt", true},
		{"docs/env/.keep", true},
		{"a.b/c", true},
		{"", false},
		{"../x", false},
		{"a/../../x", false},
		{"a/..", false},
		{"./a", false},
		{"a//b", false},
		{"a/", false},
		{"a/.../b", false}, // Windows reads "..." as "."
		{"....", false},
		{"/etc/passwd", false},
		{"/root/.ssh/id_rsa", false},
		{"/abs", false},
		{"a b.txt", false},
		{`a\b`, false},
		{"a\x00b", false},
		{"ünïcode.md", false},
		{"a?.md", false},
		{strings.Repeat("a", MaxPath+1), false},
	}
	for _, tt := range tests {
		err := Path(tt.path)
		if (err == nil) != tt.ok {
			t.Errorf("Path(%q) = %v, want ok=%v", tt.path, err, tt.ok)
		}
		if err != nil && tt.path != "" && strings.Contains(err.Error(), tt.path) {
			t.Errorf("Path(%q): the error %q repeats the path", tt.path, err)
		}
	}
}

// ciFiles are files a forge, a CI service or a development environment
// reads from a pushed branch, each as its documentation names it.
var ciFiles = []string{
	".env", ".env.local", ".envrc", ".git/config", ".git", ".gitmodules", ".gitattributes",
	".github/workflows/ci.yml", ".github/dependabot.yml", ".github/CODEOWNERS", ".gitea/workflows/build.yaml",
	".gitlab-ci.yml", ".gitlab/ci/deploy.yml", "node_modules/x/index.js", ".codesandbox/tasks.json",
	".forgejo/workflows/ci.yml", ".codecatalyst/workflows/w.yaml", "CODEOWNERS", "docs/CODEOWNERS",
	".woodpecker.yml", ".woodpecker.yaml", ".woodpecker/build.yml", ".drone.yml", ".drone.jsonnet", ".drone.star",
	".circleci/config.yml", "Jenkinsfile", "ci/Jenkinsfile.release", "release.jenkinsfile", ".travis.yml",
	"azure-pipelines.yml", "azure-pipelines.yaml", ".azure-pipelines/ci.yml", ".vsts-ci.yml",
	"bitbucket-pipelines.yml", ".buildkite/pipeline.yml", "buildkite.yml", ".semaphore/semaphore.yml",
	"appveyor.yml", ".appveyor.yml", ".cirrus.yml", ".cirrus.star", "codefresh.yml", ".codefresh/x.yml",
	".teamcity/settings.kts", "cloudbuild.yaml", "cloudbuild.json", "buildspec.yml", ".tekton/push.yaml",
	".builds/alpine.yml", ".build.yml", ".build.yaml", "bamboo-specs/bamboo.yml", "ci.gocd.yaml", "x.gocd.json",
	".harness/pipeline.yaml", "bitrise.yml", "codemagic.yaml", ".onedev-buildspec.yml", ".scrutinizer.yml",
	"buddy.yml", "codeship-steps.yml", "codeship-services.yml", ".pre-commit-config.yaml",
	".devcontainer/devcontainer.json", ".devcontainer.json", ".gitpod.yml", ".gitpod.Dockerfile", ".vscode/tasks.json",
}

// TestForbidden: every CI system's files are refused, at any depth, in any
// letter case, with trailing dots; files that merely look alike are not.
func TestForbidden(t *testing.T) {
	for _, f := range ciFiles {
		for _, p := range []string{f, "pkg/sub/" + f, strings.ToUpper(f), mixedCase(f), trailingDots(f)} {
			err := Path(p)
			var fe *ForbiddenError
			if !errors.As(err, &fe) {
				t.Errorf("Path(%q) = %v, want a ForbiddenError", p, err)
				continue
			}
			if fe.Pattern == "" || fe.Why == "" {
				t.Errorf("Path(%q): %q", p, err)
			}
		}
	}
	for _, p := range []string{
		"report.md", "src/build/main.go", "docs/jenkins.md", "ci/run.sh", "drone.md", "travis/notes.txt",
		"src/circleci.go", "build.yml", "pipelines/azure.md", "app.gocd", "vscode.md", "cloudbuilder/x",
		"buildspecs/x", "codeowners.md", "docs/github.md", "src/environment.ts", "harness.md", "tekton.md",
	} {
		if err := Path(p); err != nil {
			t.Errorf("Path(%q) = %v, want ok", p, err)
		}
	}
	// Every entry of the list is live: a name made from its glob is
	// refused.
	for _, b := range builtin {
		name := strings.ReplaceAll(b.glob, "*", "x")
		if err := Path("a/" + name); err == nil {
			t.Errorf("the entry %q refuses nothing (%q passes)", b.glob, name)
		}
	}
}

func mixedCase(s string) string {
	b := []byte(s)
	for i := range b {
		if i%2 == 0 {
			b[i] = byte(unicode.ToUpper(rune(b[i])))
		}
	}
	return string(b)
}

// trailingDots adds dots to every part, as Windows ignores them.
func trailingDots(s string) string {
	parts := strings.Split(s, "/")
	for i := range parts {
		parts[i] += ".."
	}
	return strings.Join(parts, "/")
}

func TestPattern(t *testing.T) {
	for _, tt := range []struct {
		pattern string
		refused []string
		allowed []string
	}{
		{"deploy", []string{"deploy", "deploy/x.sh", "app/deploy/x", "DEPLOY./x"}, []string{"deploy.md", "app/deployed"}},
		{"/deploy", []string{"deploy/x.sh", "Deploy"}, []string{"app/deploy/x"}},
		{"ops/*.key", []string{"ops/a.key", "x/ops/b.KEY", "ops/c.key/d"}, []string{"ops/a.pem", "ops/sub/a.key", "a.key"}},
		{"*.tf", []string{"main.tf", "infra/prod/main.tf"}, []string{"main.tfvars", "tf/main.go"}},
		{"/infra/prod", []string{"infra/prod/x"}, []string{"x/infra/prod/y", "infra/dev/x"}},
		{"Secrets", []string{"secrets/k", "a/SECRETS"}, []string{"secret"}},
	} {
		p, err := ParsePattern(tt.pattern)
		if err != nil {
			t.Fatalf("ParsePattern(%q): %v", tt.pattern, err)
		}
		for _, path := range tt.refused {
			var fe *ForbiddenError
			if err := Path(path, p); !errors.As(err, &fe) || fe.Pattern != tt.pattern {
				t.Errorf("pattern %q: Path(%q) = %v, want refused", tt.pattern, path, err)
			}
		}
		for _, path := range tt.allowed {
			if err := Path(path, p); err != nil {
				t.Errorf("pattern %q: Path(%q) = %v, want ok", tt.pattern, path, err)
			}
		}
	}
	for _, bad := range []string{"", "/", "a//b", "a/", "./a", "a/../b", "[", `a\b`, "a b", "..", "...", strings.Repeat("a", MaxPath+1)} {
		if _, err := ParsePattern(bad); err == nil {
			t.Errorf("ParsePattern(%q) accepted", bad)
		}
	}
}

func TestGatewayName(t *testing.T) {
	for name, want := range map[string]string{".env": ".env*", ".ENV.local": ".env*", ".github": ".git*", "node_modules": "node_modules*",
		".codesandbox": ".codesandbox*", ".forgejo": "", "Jenkinsfile": "", "src": ""} {
		if got, _ := GatewayName(name); got != want {
			t.Errorf("GatewayName(%q) = %q, want %q", name, got, want)
		}
	}
}

func TestBranch(t *testing.T) {
	tests := []struct {
		branch string
		ok     bool
	}{
		{"runbox/fix-1", true},
		{"feature/a.b_c", true},
		{"main", true},
		{"", false},
		{"a..b", false},
		{"a//b", false},
		{"/a", false},
		{"a/", false},
		{"-a", false},
		{"a.", false},
		{"a/.b", false},
		{".a", false},
		{"a.lock", false},
		{"a.lock/b", false},
		{"HEAD", false},
		{"a b", false},
		{"a~1", false},
		{"a^", false},
		{"a:b", false},
		{"a@{1}", false},
		{"refs/heads/../x", false},
		{strings.Repeat("b", MaxBranch+1), false},
	}
	for _, tt := range tests {
		if err := Branch(tt.branch); (err == nil) != tt.ok {
			t.Errorf("Branch(%q) = %v, want ok=%v", tt.branch, err, tt.ok)
		}
	}
}

func TestMatchBranch(t *testing.T) {
	globs := []string{"runbox/*", "agent-?"}
	for b, want := range map[string]bool{
		"runbox/x": true, "runbox/x/y": false, "agent-1": true, "agent-12": false, "main": false, "runbox": false,
	} {
		if got := MatchBranch(globs, b); got != want {
			t.Errorf("MatchBranch(%q) = %v", b, got)
		}
	}
	if MatchBranch([]string{"["}, "x") || ValidGlob("[") || ValidGlob("") || !ValidGlob("runbox/*") {
		t.Error("a bad glob matched or was valid")
	}
}

// FuzzPath: whatever a client sends, an accepted path stays inside the
// repository, is relative and clean, is made only of the gateway's
// characters, and has no part that any forbidden pattern matches in any
// case or with trailing dots.
func FuzzPath(f *testing.F) {
	for _, s := range []string{"report.md", "../x", ".git/config", ".env", "a/b/c.txt", "a//b", "/etc/passwd",
		"node_modules/a", "x/.github/w", ".", "a/./b", "a/b/..", "%2e%2e/x", "..\\x", "a\x00", ".Forgejo./w",
		"JENKINSFILE", "a/.drone.yml.", "..."} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, p string) {
		if Path(p) != nil {
			return
		}
		if path.IsAbs(p) || path.Clean(p) != p || path.Clean("/"+p) != "/"+p {
			t.Fatalf("accepted %q, which is not a clean relative path", p)
		}
		if !gatewayChars.MatchString(p) || len(p) > MaxPath {
			t.Fatalf("accepted %q, outside the gateway's pattern", p)
		}
		for seg := range strings.SplitSeq(p, "/") {
			folded := strings.TrimRight(strings.ToLower(seg), ".")
			if folded == "" {
				t.Fatalf("accepted %q, which holds the part %q", p, seg)
			}
			for _, b := range builtin {
				if ok, _ := path.Match(b.glob, folded); ok {
					t.Fatalf("accepted %q, whose part %q is %s", p, seg, b.glob)
				}
			}
		}
	})
}

// FuzzForbidden: a forbidden name, wherever it stands in a path, in
// whatever letter case and with trailing dots, is refused as forbidden.
func FuzzForbidden(f *testing.F) {
	f.Add(uint8(0), "src", "x.yml", uint64(0), uint8(0))
	f.Add(uint8(17), "", "", uint64(0xffffffff), uint8(2))
	f.Add(uint8(40), "a/b/c", "d", uint64(0xaaaa), uint8(1))
	f.Fuzz(func(t *testing.T, which uint8, prefix, suffix string, mask uint64, dots uint8) {
		name := ciFiles[int(which)%len(ciFiles)]
		b := []byte(name)
		for i := range b {
			if mask&(1<<(i%64)) != 0 {
				b[i] = byte(unicode.ToUpper(rune(b[i])))
			}
		}
		name = string(b) + strings.Repeat(".", int(dots%4))
		parts := append(validParts(prefix), name)
		parts = append(parts, validParts(suffix)...)
		p := strings.Join(parts, "/")
		if len(p) > MaxPath {
			return
		}
		var fe *ForbiddenError
		if err := Path(p); !errors.As(err, &fe) {
			t.Fatalf("Path(%q) = %v, want a ForbiddenError", p, err)
		}
	})
}

// validParts keeps the parts of s that Path accepts on their own.
func validParts(s string) []string {
	var out []string
	for part := range strings.SplitSeq(s, "/") {
		if part != "" && gatewayChars.MatchString(part) && strings.Trim(part, ".") != "" && Path(part) == nil {
			out = append(out, part)
		}
	}
	return out
}

// FuzzBranch: an accepted branch is one git takes as written.
func FuzzBranch(f *testing.F) {
	for _, s := range []string{"runbox/a", "a..b", "a//b", "-x", "x.lock", ".x", "HEAD", "a/b/", "x@{1}"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, b string) {
		if Branch(b) != nil {
			return
		}
		if !gatewayChars.MatchString(b) || strings.Contains(b, "..") || strings.Contains(b, "//") ||
			strings.HasPrefix(b, "/") || strings.HasSuffix(b, "/") || strings.HasPrefix(b, "-") || b == "HEAD" {
			t.Fatalf("accepted %q", b)
		}
		for seg := range strings.SplitSeq(b, "/") {
			if seg == "" || strings.HasPrefix(seg, ".") || strings.HasSuffix(seg, ".lock") {
				t.Fatalf("accepted %q with the part %q", b, seg)
			}
		}
	})
}
