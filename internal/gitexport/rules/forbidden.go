package rules

import (
	"errors"
	"path"
	"strings"
)

// What runbox never commits: files that a forge, a CI service or a
// development environment reads from a pushed branch and acts on — runs
// code with the repository's secrets, fetches other repositories, changes
// who reviews — and the gateway's own four (secrets, git's files,
// dependencies, the sandbox vendor's settings). A pushed branch is enough
// for most of them: CI that triggers on push runs on the agent's branch
// before anyone reviews anything.
//
// Each entry is a Pattern, matched against every part of a path in any
// letter case and with trailing dots ignored (so .Forgejo/, sub/.drone.yml
// and JENKINSFILE. are refused alike): a forbidden folder refuses every
// path under it. Operators add patterns per repository (forbidden_paths
// in GIT_REPOS_FILE) for what their own automation reads.
//
// Considered and left out, because they are ordinary project files whose
// commands run only where the owner's own CI is configured to run them:
// package.json, Makefile, Dockerfile, netlify.toml, vercel.json (their
// builds run the project's scripts either way: SECURITY.md says to
// restrict CI on agents' branches), renovate.json and .mergify.yml (read
// from the base branch only), .husky/ (hooks installed by the project's
// own scripts), .idea/ (runs nothing on open without the user's consent).
var builtin = []struct {
	glob    string
	gateway bool   // one of the security gateway's own four
	why     string // said to the client
}{
	// The gateway's four.
	{".env*", true, "secrets (.env, .env.local) and .envrc, which direnv runs"},
	{".git*", true, "git's own files and the forges' folders: .git/, .gitmodules (fetched on clone), " +
		".gitattributes (filters), .github/ (Actions workflows, dependabot, CODEOWNERS), .gitea/ and .gitlab/ workflows, .gitlab-ci.yml"},
	{"node_modules*", true, "installed dependencies"},
	{".codesandbox*", true, "the sandbox vendor's tasks"},

	// Forges' own CI (.github, .gitea and .gitlab are .git*).
	{".forgejo", false, "Forgejo Actions workflows, run on push with the repository's secrets"},
	{".codecatalyst", false, "AWS CodeCatalyst workflows, run on push"},
	{"codeowners", false, "who must review changes (read from the root, docs/ and the forges' folders)"},

	// CI services that find their pipeline in the pushed branch.
	{".woodpecker*", false, "Woodpecker CI pipelines (.woodpecker.yml, .woodpecker/)"},
	{".drone*", false, "Drone CI pipelines (.drone.yml, .drone.jsonnet, .drone.star)"},
	{".circleci", false, "CircleCI pipelines"},
	{"jenkinsfile*", false, "Jenkins pipelines"},
	{"*.jenkinsfile", false, "Jenkins pipelines"},
	{".travis*", false, "Travis CI builds"},
	{"azure-pipelines*", false, "Azure Pipelines"},
	{".azure-pipelines", false, "Azure Pipelines"},
	{".vsts-ci*", false, "Azure Pipelines (its older default name)"},
	{"bitbucket-pipelines*", false, "Bitbucket Pipelines"},
	{".buildkite*", false, "Buildkite pipelines (.buildkite/pipeline.yml)"},
	{"buildkite.*", false, "Buildkite pipelines (buildkite.yml)"},
	{".semaphore*", false, "Semaphore CI pipelines"},
	{"appveyor*", false, "AppVeyor builds"},
	{".appveyor*", false, "AppVeyor builds"},
	{".cirrus*", false, "Cirrus CI tasks (.cirrus.yml, .cirrus.star)"},
	{"codefresh*", false, "Codefresh pipelines"},
	{".codefresh", false, "Codefresh pipelines"},
	{".teamcity*", false, "TeamCity's versioned settings (Kotlin DSL, run by the server)"},
	{"cloudbuild.*", false, "Google Cloud Build triggers"},
	{"buildspec.*", false, "AWS CodeBuild builds"},
	{".tekton", false, "Tekton Pipelines as Code, run on push"},
	{".builds", false, "sourcehut builds, run on push"},
	{".build.y*ml", false, "sourcehut builds, run on push"},
	{"bamboo-specs", false, "Bamboo Specs, scanned on push"},
	{"*.gocd.*", false, "GoCD pipelines (config repositories)"},
	{".harness", false, "Harness pipelines stored in the repository"},
	{"bitrise.*", false, "Bitrise workflows"},
	{"codemagic.*", false, "Codemagic workflows"},
	{".onedev-buildspec*", false, "OneDev build specs"},
	{".scrutinizer*", false, "Scrutinizer builds"},
	{"buddy.y*ml", false, "Buddy pipelines"},
	{"codeship-*", false, "CodeShip steps and services"},
	{".pre-commit-config*", false, "pre-commit hooks: pre-commit.ci runs them on push, and reviewers' machines on commit"},

	// Development environments a forge starts from the branch: their
	// prebuilds run on push, with the user's or the organization's secrets.
	{".devcontainer*", false, "dev containers, whose commands Codespaces prebuilds run on push"},
	{".gitpod*", false, "Gitpod tasks, run by prebuilds on push"},
	{".vscode", false, "editor tasks that run when the folder opens (trusted in Codespaces)"},
}

var builtinPatterns = func() []Pattern {
	ps := make([]Pattern, len(builtin))
	for i, b := range builtin {
		p, err := ParsePattern(b.glob)
		if err != nil {
			panic("rules: built-in pattern " + b.glob + ": " + err.Error())
		}
		ps[i] = p
	}
	return ps
}()

// ForbiddenError is a path that names something runbox does not commit.
// Its text names the pattern and why, never the path.
type ForbiddenError struct {
	Pattern string
	Why     string
	// Gateway says the pattern is one of the security gateway's own four,
	// refused since before the list grew (its clients know the refusal as
	// PATH_TRAVERSAL).
	Gateway bool
}

func (e *ForbiddenError) Error() string {
	return "the path names " + e.Pattern + ", which is not committed: " + e.Why
}

// forbidden returns the first built-in or extra pattern that a part of p
// matches. p is split on '/' as it is.
func forbidden(p string, extra []Pattern) error {
	parts := strings.Split(p, "/")
	for i := range parts {
		parts[i] = foldPart(parts[i])
	}
	for i, pat := range builtinPatterns {
		if pat.match(parts) {
			return &ForbiddenError{Pattern: builtin[i].glob, Why: builtin[i].why, Gateway: builtin[i].gateway}
		}
	}
	for _, pat := range extra {
		if pat.match(parts) {
			return &ForbiddenError{Pattern: pat.String(), Why: "this repository's forbidden_paths"}
		}
	}
	return nil
}

// GatewayName reports whether one part of a path (a file or folder name)
// is one of the security gateway's four forbidden names (.env*, .git*,
// node_modules*, .codesandbox*), and which: the project tools refuse
// those, and only those, in what they write into a sandbox.
func GatewayName(part string) (string, bool) {
	parts := []string{foldPart(part)}
	for i, b := range builtin {
		if b.gateway && builtinPatterns[i].match(parts) {
			return b.glob, true
		}
	}
	return "", false
}

// foldPart is a path's part as the file systems forges and their users
// run on may read it: in lower case (macOS, Windows), without the trailing
// dots and spaces Windows drops (".github." is .github there).
func foldPart(s string) string {
	return strings.TrimRight(strings.ToLower(s), ". ")
}

// Pattern is a glob of one or more '/'-separated parts, each matched with
// path.Match against the parts of a path, folded (lower case, no trailing
// dots). It matches a run of consecutive parts anywhere in the path —
// "deploy" refuses deploy/x.sh and app/deploy, "ops/*.key" refuses
// ops/a.key and x/ops/a.key — or, written with a leading '/', from the
// repository's root only. A pattern that matches a folder refuses
// everything under it.
type Pattern struct {
	text     string
	anchored bool
	parts    []string
}

// MaxPatterns bounds forbidden_paths.
const MaxPatterns = 256

var errPattern = errors.New(`a pattern is one or more '/'-separated globs (path.Match), optionally starting with '/', ` +
	`without empty, "." or ".." parts, '\', spaces or control characters, at most 1024 bytes`)

// ParsePattern reads a pattern as an operator writes it.
func ParsePattern(s string) (Pattern, error) {
	p := Pattern{text: s}
	body, anchored := strings.CutPrefix(s, "/")
	p.anchored = anchored
	if body == "" || len(s) > MaxPath || strings.ContainsFunc(s, func(r rune) bool { return r <= ' ' || r == 0x7f || r == '\\' }) {
		return Pattern{}, errPattern
	}
	for part := range strings.SplitSeq(body, "/") {
		folded := foldPart(part)
		if folded == "" || part == "." || part == ".." {
			return Pattern{}, errPattern
		}
		if _, err := path.Match(folded, ""); err != nil {
			return Pattern{}, errPattern
		}
		p.parts = append(p.parts, folded)
	}
	return p, nil
}

// String is the pattern as it was written.
func (p Pattern) String() string { return p.text }

// match reports whether the pattern matches a run of the folded parts.
func (p Pattern) match(parts []string) bool {
	last := len(parts) - len(p.parts)
	if p.anchored {
		last = min(last, 0)
	}
	for start := 0; start <= last; start++ {
		if p.matchAt(parts[start:]) {
			return true
		}
	}
	return false
}

func (p Pattern) matchAt(parts []string) bool {
	for i, g := range p.parts {
		if ok, _ := path.Match(g, parts[i]); !ok {
			return false
		}
	}
	return true
}
