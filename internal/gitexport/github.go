package gitexport

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/google/go-github/v84/github"

	"github.com/runbox-dev/runbox"
)

// githubForge is a repository on GitHub (or GitHub Enterprise Server),
// through google/go-github for the REST calls; commits are pushed over
// git's HTTP protocol like every forge's.
type githubForge struct {
	repo   *Repo
	git    *gitRemote
	client *github.Client
}

func newGitHub(r *Repo, hc *http.Client, tempDir string) (*githubForge, error) {
	g, err := newGitRemote(r, hc, tempDir)
	if err != nil {
		return nil, err
	}
	base, err := url.Parse(r.APIURL)
	if err != nil {
		return nil, fmt.Errorf("repository %s: API URL: %w", r.ID, err)
	}
	c := github.NewClient(hc).WithAuthToken(r.Token.Reveal())
	c.BaseURL = base
	c.UserAgent = userAgent
	return &githubForge{repo: r, git: g, client: c}, nil
}

// Headers GitHub's REST answers carry about the token that asked.
const (
	// A classic token's (or an OAuth app's) scopes, comma-separated;
	// absent for fine-grained tokens and GitHub App tokens.
	headerScopes = "X-OAuth-Scopes"
	// When a token with an expiry stops working: "2026-12-31 23:59:59 UTC".
	headerExpiry = "GitHub-Authentication-Token-Expiration"
)

// broadScope reports a classic scope that reaches beyond one
// repository's contents: a classic token is its owner's on every
// repository, so any scope that writes or administers is refused.
func broadScope(s string) bool {
	switch s {
	case "repo", "public_repo", "repo_deployment", "repo:invite", "security_events", "delete_repo", "workflow",
		"user", "gist", "codespace", "project", "notifications", "copilot":
		return true
	}
	return strings.HasPrefix(s, "admin:") || strings.HasPrefix(s, "write:") || strings.HasPrefix(s, "delete:") ||
		strings.HasPrefix(s, "manage_")
}

// Check: the repository's REST answer tells a classic token by its
// X-OAuth-Scopes (refused when any scope is broad) and whether the token's
// user may push; the receive-pack advertisement tells whether the token
// itself may (a fine-grained token needs "Contents: read and write").
func (f *githubForge) Check(ctx context.Context) (Access, error) {
	repo, resp, err := f.client.Repositories.Get(ctx, f.repo.Owner, f.repo.Name)
	if err != nil {
		return Access{}, githubError("check", resp, err)
	}
	var a Access
	if v, classic := resp.Header[http.CanonicalHeaderKey(headerScopes)]; classic {
		a.Scopes = []string{}
		for s := range strings.SplitSeq(strings.Join(v, ","), ",") {
			if s = strings.TrimSpace(s); s != "" {
				a.Scopes = append(a.Scopes, s)
			}
		}
		if broad := slices.DeleteFunc(slices.Clone(a.Scopes), func(s string) bool { return !broadScope(s) }); len(broad) > 0 {
			return a, &TooBroadError{Repo: f.repo.ID, Why: fmt.Sprintf(
				"it is a classic GitHub token with the scopes %s, which reach every repository of its owner; use a fine-grained token limited to %s/%s with Contents and Pull requests read and write",
				strings.Join(broad, ", "), f.repo.Owner, f.repo.Name)}
		}
	}
	if exp := resp.Header.Get(headerExpiry); exp != "" {
		if t, err := time.Parse("2006-01-02 15:04:05 MST", exp); err == nil {
			a.Expires = t
		}
	}
	if p := repo.GetPermissions(); p != nil && !p.GetPush() {
		return a, runbox.Errorf(runbox.EPermissionDenied, "this repository's token may not push here")
	}
	if err := f.git.canPush(ctx); err != nil {
		return a, err
	}
	a.Push = true
	return a, nil
}

func (f *githubForge) Push(ctx context.Context, c Commit) (string, error) { return f.git.push(ctx, c) }

func (f *githubForge) OpenPullRequest(ctx context.Context, head, base, title, body string) (string, error) {
	pr, resp, err := f.client.PullRequests.Create(ctx, f.repo.Owner, f.repo.Name, &github.NewPullRequest{
		Title: &title, Head: &head, Base: &base, Body: &body,
	})
	if err == nil {
		return pr.GetHTMLURL(), nil
	}
	if resp == nil || resp.StatusCode != http.StatusUnprocessableEntity {
		return "", githubError("pull request", resp, err)
	}
	// 422 also says "A pull request already exists for owner:branch":
	// the commit is in that one.
	open, lresp, lerr := f.client.PullRequests.List(ctx, f.repo.Owner, f.repo.Name, &github.PullRequestListOptions{
		State: "open", Head: f.repo.Owner + ":" + head, Base: base,
	})
	if lerr != nil {
		return "", githubError("pull request", lresp, lerr)
	}
	if len(open) == 0 {
		return "", githubError("pull request", resp, err)
	}
	return open[0].GetHTMLURL(), nil
}

// ReadFile reads through the contents API, which returns a file of up to
// 1 MB inline (larger ones come without content): limit is at most that.
func (f *githubForge) ReadFile(ctx context.Context, branch, path string, limit int64) ([]byte, error) {
	file, dir, resp, err := f.client.Repositories.GetContents(ctx, f.repo.Owner, f.repo.Name, path,
		&github.RepositoryContentGetOptions{Ref: branch})
	switch {
	case errors.Is(err, github.ErrPathForbidden):
		return nil, runbox.Errorf(runbox.EPathTraversal, `the path must not hold ".."`)
	case resp != nil && resp.StatusCode == http.StatusNotFound:
		return nil, runbox.Errorf(runbox.ENotFound, "there is no file %s on branch %s", path, branch)
	case err != nil:
		return nil, githubError("read", resp, err)
	case dir != nil || file == nil || file.GetType() != "file":
		return nil, runbox.Errorf(runbox.ENotFound, "%s on branch %s is not a file", path, branch)
	case int64(file.GetSize()) > limit || file.GetEncoding() == "none":
		return nil, runbox.Errorf(runbox.EFileSizeExceeded, "%s is larger than the %d bytes read_github_file returns", path, limit)
	}
	s, err := file.GetContent()
	if err != nil {
		return nil, &forgeError{op: "read", err: err}
	}
	return []byte(s), nil
}

func githubError(op string, resp *github.Response, err error) error {
	if _, ok := errors.AsType[*runbox.Error](err); ok {
		return err
	}
	fe := &forgeError{op: op, err: err}
	if resp != nil && resp.Response != nil {
		fe.status = resp.StatusCode
	}
	// GitHub says "rate limited" with 403 (or 429): go-github tells them
	// apart.
	if rl, ok := errors.AsType[*github.RateLimitError](err); ok {
		fe.status, fe.retryAfter = http.StatusTooManyRequests, time.Until(rl.Rate.Reset.Time)
	}
	if ab, ok := errors.AsType[*github.AbuseRateLimitError](err); ok {
		fe.status = http.StatusTooManyRequests
		if ab.RetryAfter != nil {
			fe.retryAfter = *ab.RetryAfter
		}
	}
	return fe
}
