package gitexport

import (
	"bytes"
	"cmp"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/mail"
	"net/url"
	"os"
	"regexp"
	"slices"
	"strings"

	"github.com/goccy/go-yaml"

	"github.com/runbox-dev/runbox"
	"github.com/runbox-dev/runbox/internal/gitexport/rules"
)

// Git is GIT_REPOS_FILE: the repositories conversations may commit to, and
// who the commits say made them. Nil when the file is not set.
type Git struct {
	// Repos are by repo_id.
	Repos map[string]*Repo
	// Author and Committer sign every commit; Committer defaults to Author.
	Author, Committer Signature
}

// Signature is a commit's author or committer.
type Signature struct {
	Name, Email string
}

// Forges runbox speaks to.
const (
	ForgeGitHub = "github"
	ForgeGitea  = "gitea" // Forgejo too: the same API
)

// Repo is one repository of GIT_REPOS_FILE.
type Repo struct {
	ID    string
	Forge string // ForgeGitHub or ForgeGitea
	// URL is the repository's HTTP(S) address as git clones it, without
	// credentials: https://github.com/acme/reports.git.
	URL string
	// Owner and Name are the repository's, from URL's path.
	Owner, Name string
	// APIURL is the forge's REST API: GIT_API_URL for its forge, or what
	// URL implies (https://api.github.com/ for github.com, the server's
	// root for Gitea).
	APIURL string
	Token  Secret
	// AllowedBranches are the globs (path.Match) a branch must match.
	AllowedBranches []string
	// BaseBranch is where pull requests go; nothing is pushed to it.
	BaseBranch string
	// Clients may use the repository; nobody else sees it.
	Clients []string
	// ForbiddenPaths are refused besides the built-in list (rules).
	ForbiddenPaths []rules.Pattern
}

// Secret is a credential. It prints as "[redacted]" however it is
// formatted, logged or encoded; Reveal returns it.
type Secret string

// Reveal returns the secret itself, for the one place that sends it.
func (s Secret) Reveal() string { return string(s) }

const redacted = "[redacted]"

func (Secret) String() string               { return redacted }
func (Secret) GoString() string             { return redacted }
func (Secret) Format(f fmt.State, _ rune)   { _, _ = io.WriteString(f, redacted) }
func (Secret) MarshalText() ([]byte, error) { return []byte(redacted), nil }
func (Secret) LogValue() slog.Value         { return slog.StringValue(redacted) }

// gitFile is GIT_REPOS_FILE as written.
type gitFile struct {
	Author    *fileSignature          `yaml:"author"`
	Committer *fileSignature          `yaml:"committer"`
	Repos     map[string]gitFileEntry `yaml:"repos"`
}

type fileSignature struct {
	Name  string `yaml:"name"`
	Email string `yaml:"email"`
}

type gitFileEntry struct {
	Forge           string   `yaml:"forge"`
	URL             string   `yaml:"url"`
	Token           string   `yaml:"token"`
	TokenFile       string   `yaml:"token_file"`
	AllowedBranches []string `yaml:"allowed_branches"`
	BaseBranch      string   `yaml:"base_branch"`
	Clients         []string `yaml:"clients"`
	ForbiddenPaths  []string `yaml:"forbidden_paths"`
}

// DefaultAllowedBranches is what a repository without allowed_branches
// accepts: branches runbox's agents can be told apart by.
var DefaultAllowedBranches = []string{"runbox/*"}

// DefaultSignature signs commits when the file names nobody.
var DefaultSignature = Signature{Name: "runbox", Email: "runbox@localhost"}

var repoIDPattern = regexp.MustCompile(`^[A-Za-z0-9_.-]{1,64}$`)

// maxTokenFile bounds a token_file: a token is short.
const maxTokenFile = 4096

// LoadGit reads GIT_REPOS_FILE (file) with GIT_API_URL (apiURLs); known
// are the client names tokens give. Errors are one line that names its
// variable and never holds a token.
func LoadGit(file, apiURLs string, known map[string]bool) (*Git, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("config: GIT_REPOS_FILE: %w", err)
	}
	var f gitFile
	if err := yaml.UnmarshalWithOptions(b, &f, yaml.Strict(), yaml.DisallowUnknownField()); err != nil {
		// goccy/go-yaml quotes the offending source line, which may be a
		// token: only its first line (the position and the rule) is kept.
		return nil, fmt.Errorf("config: GIT_REPOS_FILE %s: %s", file, strings.SplitN(err.Error(), "\n", 2)[0])
	}
	apis, err := parseAPIURLs(apiURLs)
	if err != nil {
		return nil, err
	}
	g := &Git{Repos: map[string]*Repo{}, Author: DefaultSignature}
	if f.Author != nil {
		if g.Author, err = signature("author", *f.Author); err != nil {
			return nil, err
		}
	}
	g.Committer = g.Author
	if f.Committer != nil {
		if g.Committer, err = signature("committer", *f.Committer); err != nil {
			return nil, err
		}
	}
	if len(f.Repos) == 0 {
		return nil, fmt.Errorf("config: GIT_REPOS_FILE %s lists no repos", file)
	}
	for id, e := range f.Repos {
		r, err := loadRepo(id, e, apis, known)
		if err != nil {
			return nil, fmt.Errorf("config: GIT_REPOS_FILE: repo %q: %w", cut(id), err)
		}
		g.Repos[id] = r
	}
	return g, nil
}

func loadRepo(id string, e gitFileEntry, apis map[string]string, known map[string]bool) (*Repo, error) {
	if !repoIDPattern.MatchString(id) {
		return nil, fmt.Errorf("the id must be 1 to 64 letters, digits, '.', '_' or '-'")
	}
	r := &Repo{ID: id, BaseBranch: cmp.Or(e.BaseBranch, "main"), AllowedBranches: e.AllowedBranches}
	switch strings.ToLower(e.Forge) {
	case ForgeGitHub:
		r.Forge = ForgeGitHub
	case ForgeGitea, "forgejo":
		r.Forge = ForgeGitea
	default:
		return nil, fmt.Errorf("forge must be github, gitea or forgejo")
	}
	u, err := repoURL(e.URL)
	if err != nil {
		return nil, err
	}
	segs := strings.Split(strings.Trim(u.Path, "/"), "/")
	r.Owner, r.Name = segs[len(segs)-2], strings.TrimSuffix(segs[len(segs)-1], ".git")
	r.URL = u.String()
	if r.APIURL, err = apiURL(r.Forge, u, segs, apis[r.Forge]); err != nil {
		return nil, err
	}

	switch {
	case (e.Token == "") == (e.TokenFile == ""):
		return nil, fmt.Errorf("needs exactly one of token and token_file")
	case e.Token != "":
		r.Token = Secret(strings.TrimSpace(e.Token))
	default:
		tok, err := readTokenFile(e.TokenFile)
		if err != nil {
			return nil, err
		}
		r.Token = tok
	}
	if tok := r.Token.Reveal(); len(tok) < minGitToken || strings.ContainsAny(tok, " \t\r\n") {
		return nil, fmt.Errorf("the token must be at least %d characters, without spaces", minGitToken)
	}

	if rules.Branch(r.BaseBranch) != nil {
		return nil, fmt.Errorf("base_branch is not a valid branch name")
	}
	if len(r.AllowedBranches) == 0 {
		r.AllowedBranches = slices.Clone(DefaultAllowedBranches)
	}
	for _, p := range r.AllowedBranches {
		if !rules.ValidGlob(p) {
			return nil, fmt.Errorf("allowed_branches: %q is not a valid pattern", cut(p))
		}
	}
	if len(e.Clients) == 0 {
		return nil, fmt.Errorf("clients must name the clients that may use it")
	}
	for _, c := range e.Clients {
		if !runbox.ValidClientName(c) {
			return nil, fmt.Errorf("clients: %q is not a client name", cut(c))
		}
		if !known[c] {
			return nil, fmt.Errorf("clients: no token belongs to a client %q", c)
		}
	}
	r.Clients = slices.Clone(e.Clients)
	if len(e.ForbiddenPaths) > rules.MaxPatterns {
		return nil, fmt.Errorf("forbidden_paths: at most %d patterns", rules.MaxPatterns)
	}
	for _, fp := range e.ForbiddenPaths {
		p, err := rules.ParsePattern(fp)
		if err != nil {
			return nil, fmt.Errorf("forbidden_paths: %q: %w", cut(fp), err)
		}
		r.ForbiddenPaths = append(r.ForbiddenPaths, p)
	}
	return r, nil
}

// minGitToken bounds how short a forge token may be: every forge's are
// longer.
const minGitToken = 16

// repoURL checks a repository's address: http(s), no credentials, no
// query, an owner and a name. Plain http is accepted only to a loopback
// host: the token travels with every request.
func repoURL(raw string) (*url.URL, error) {
	u, err := url.Parse(strings.TrimSpace(raw))
	if err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" {
		return nil, fmt.Errorf("url must be the repository's https:// address")
	}
	if u.User != nil || u.RawQuery != "" || u.Fragment != "" {
		return nil, fmt.Errorf("url must hold no credentials, query or fragment (the token goes in token or token_file)")
	}
	if u.Scheme == "http" && !loopback(u.Hostname()) {
		return nil, fmt.Errorf("url must be https:// (plain http only to a loopback address): the token travels with every request")
	}
	segs := strings.Split(strings.Trim(u.Path, "/"), "/")
	if len(segs) < 2 || slices.Contains(segs, "") || slices.Contains(segs, "..") || strings.TrimSuffix(segs[len(segs)-1], ".git") == "" {
		return nil, fmt.Errorf("url must name the repository: https://<host>/<owner>/<name>")
	}
	u.Path = "/" + strings.Join(segs, "/")
	return u, nil
}

func loopback(host string) bool {
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// apiURL is the REST API a repository's forge answers on: the
// forge's GIT_API_URL, or what the repository's address implies.
func apiURL(forge string, repo *url.URL, segs []string, configured string) (string, error) {
	if configured != "" {
		return configured, nil
	}
	switch {
	case forge == ForgeGitHub && repo.Host == "github.com":
		return "https://api.github.com/", nil
	case forge == ForgeGitHub:
		// GitHub Enterprise Server answers under /api/v3/.
		return repo.Scheme + "://" + repo.Host + "/api/v3/", nil
	}
	// Gitea: the server's root, which may be a sub-path, and which the
	// SDK adds /api/v1 to.
	root := strings.Join(segs[:len(segs)-2], "/")
	if root != "" {
		root = "/" + root
	}
	return repo.Scheme + "://" + repo.Host + root + "/", nil
}

// parseAPIURLs reads GIT_API_URL: "github=https://ghe.example.com/api/v3/,
// gitea=https://git.example.com/"; a lone URL is every forge's.
func parseAPIURLs(v string) (map[string]string, error) {
	out := map[string]string{}
	v = strings.TrimSpace(v)
	if v == "" {
		return out, nil
	}
	fail := fmt.Errorf("config: GIT_API_URL must be an http(s) URL, or forge=URL pairs (github=…,gitea=…) separated by commas")
	if !strings.Contains(v, "=") || strings.HasPrefix(v, "http") {
		u, err := apiBase(v)
		if err != nil {
			return nil, fail
		}
		out[ForgeGitHub], out[ForgeGitea] = u, u
		return out, nil
	}
	for pair := range strings.SplitSeq(v, ",") {
		forge, raw, ok := strings.Cut(strings.TrimSpace(pair), "=")
		forge = strings.ToLower(strings.TrimSpace(forge))
		if forge == "forgejo" {
			forge = ForgeGitea
		}
		u, err := apiBase(raw)
		if !ok || err != nil || (forge != ForgeGitHub && forge != ForgeGitea) {
			return nil, fail
		}
		out[forge] = u
	}
	return out, nil
}

// apiBase checks an API address and gives it one trailing slash; a
// Gitea address may be given with its /api/v1.
func apiBase(raw string) (string, error) {
	u, err := url.Parse(strings.TrimSpace(raw))
	if err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" || u.User != nil || u.RawQuery != "" {
		return "", fmt.Errorf("bad API URL")
	}
	if u.Scheme == "http" && !loopback(u.Hostname()) {
		return "", fmt.Errorf("plain http to a remote host")
	}
	u.Path = strings.TrimSuffix(strings.TrimSuffix(u.Path, "/"), "/api/v1") + "/"
	return u.String(), nil
}

func readTokenFile(name string) (Secret, error) {
	f, err := os.Open(name)
	if err != nil {
		return "", fmt.Errorf("token_file cannot be read: %w", err)
	}
	defer f.Close()
	var b bytes.Buffer
	if _, err := b.ReadFrom(io.LimitReader(f, maxTokenFile+1)); err != nil {
		return "", fmt.Errorf("token_file cannot be read: %w", err)
	}
	if b.Len() > maxTokenFile {
		return "", fmt.Errorf("token_file is larger than a token")
	}
	return Secret(strings.TrimSpace(b.String())), nil
}

func signature(what string, s fileSignature) (Signature, error) {
	s.Name, s.Email = strings.TrimSpace(s.Name), strings.TrimSpace(s.Email)
	if s.Name == "" || len(s.Name) > 100 || strings.ContainsAny(s.Name, "<>\n\r\x00") {
		return Signature{}, fmt.Errorf("config: GIT_REPOS_FILE: %s.name must be 1 to 100 characters without <, > or line breaks", what)
	}
	if a, err := mail.ParseAddress(s.Email); err != nil || a.Address != s.Email || len(s.Email) > 200 {
		return Signature{}, fmt.Errorf("config: GIT_REPOS_FILE: %s.email must be an e-mail address", what)
	}
	return Signature{Name: s.Name, Email: s.Email}, nil
}

func cut(s string) string {
	if len(s) > 40 {
		return s[:40] + "…"
	}
	return s
}
