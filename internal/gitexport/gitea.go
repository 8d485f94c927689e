package gitexport

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"time"

	"code.gitea.io/sdk/gitea"

	"github.com/runbox-dev/runbox"
)

// giteaForge is a repository on Gitea or Forgejo, through the Gitea SDK.
type giteaForge struct {
	repo *Repo
	git  *gitRemote
	hc   *http.Client
}

func newGitea(r *Repo, hc *http.Client, tempDir string) (*giteaForge, error) {
	g, err := newGitRemote(r, hc, tempDir)
	if err != nil {
		return nil, err
	}
	return &giteaForge{repo: r, git: g, hc: hc}, nil
}

// client returns an SDK client for one call: the SDK takes its context
// per client, not per request. The server's version is not asked for
// (every call here exists since Gitea 1.17).
func (f *giteaForge) client(ctx context.Context) (*gitea.Client, error) {
	return gitea.NewClient(strings.TrimSuffix(f.repo.APIURL, "/"), gitea.SetToken(f.repo.Token.Reveal()),
		gitea.SetHTTPClient(f.hc), gitea.SetContext(ctx), gitea.SetGiteaVersion(""), gitea.SetUserAgent(userAgent))
}

// Check: the token must push (the receive-pack advertisement), and must
// be neither a site administrator's (the admin API answers it) nor able
// to administer the repository (its permissions say admin): Gitea's
// tokens cannot be limited to one repository, so the user they belong to
// must be — a collaborator with write access (docs/git.md).
func (f *giteaForge) Check(ctx context.Context) (Access, error) {
	c, err := f.client(ctx)
	if err != nil {
		return Access{}, err
	}
	if _, resp, err := c.AdminListUsers(gitea.AdminListUsersOptions{ListOptions: gitea.ListOptions{PageSize: 1}}); err == nil {
		return Access{}, &TooBroadError{Repo: f.repo.ID, Why: "it reaches the site's admin API; use a token of a user that is not a site administrator"}
	} else if resp == nil || (resp.StatusCode != http.StatusForbidden && resp.StatusCode != http.StatusUnauthorized) {
		return Access{}, giteaError("check", resp, err)
	}
	repo, resp, err := c.GetRepo(f.repo.Owner, f.repo.Name)
	if err != nil {
		return Access{}, giteaError("check", resp, err)
	}
	if repo.Permissions != nil && repo.Permissions.Admin {
		return Access{}, &TooBroadError{Repo: f.repo.ID,
			Why: "its user administers the repository (it could delete it or change its settings); use a user that is a collaborator with write access"}
	}
	if err := f.git.canPush(ctx); err != nil {
		return Access{}, err
	}
	return Access{Push: true}, nil
}

func (f *giteaForge) Push(ctx context.Context, c Commit) (string, error) { return f.git.push(ctx, c) }

func (f *giteaForge) OpenPullRequest(ctx context.Context, head, base, title, body string) (string, error) {
	c, err := f.client(ctx)
	if err != nil {
		return "", err
	}
	pr, resp, err := c.CreatePullRequest(f.repo.Owner, f.repo.Name, gitea.CreatePullRequestOption{
		Head: head, Base: base, Title: title, Body: body,
	})
	if err == nil {
		return pr.HTMLURL, nil
	}
	if resp == nil || resp.StatusCode != http.StatusConflict {
		return "", giteaError("pull request", resp, err)
	}
	// 409: one is open for this branch already; the commit is in it.
	pr, resp, err = c.GetPullRequestByBaseHead(f.repo.Owner, f.repo.Name, base, head)
	if err != nil {
		return "", giteaError("pull request", resp, err)
	}
	return pr.HTMLURL, nil
}

func (f *giteaForge) ReadFile(ctx context.Context, branch, path string, limit int64) ([]byte, error) {
	c, err := f.client(ctx)
	if err != nil {
		return nil, err
	}
	// The raw file, streamed: no more than limit+1 bytes are read.
	body, resp, err := c.GetFileReader(f.repo.Owner, f.repo.Name, branch, path)
	if err != nil {
		if resp != nil && resp.StatusCode == http.StatusNotFound {
			return nil, runbox.Errorf(runbox.ENotFound, "there is no file %s on branch %s", path, branch)
		}
		return nil, giteaError("read", resp, err)
	}
	defer body.Close()
	data, err := io.ReadAll(io.LimitReader(body, limit+1))
	if err != nil {
		return nil, &forgeError{op: "read", err: err}
	}
	if int64(len(data)) > limit {
		return nil, runbox.Errorf(runbox.EFileSizeExceeded, "%s is larger than the %d bytes read_github_file returns", path, limit)
	}
	return data, nil
}

func giteaError(op string, resp *gitea.Response, err error) error {
	if _, ok := errors.AsType[*runbox.Error](err); ok {
		return err
	}
	fe := &forgeError{op: op, err: err}
	if resp != nil && resp.Response != nil {
		fe.status = resp.StatusCode
		if s, err := strconv.Atoi(resp.Header.Get("Retry-After")); err == nil {
			fe.retryAfter = time.Duration(s) * time.Second
		}
	}
	return fe
}

// TooBroadError is a token that may do more than runbox needs: the
// repository is not used with it. Error is for the operator; a client
// sees GITHUB_AUTH_FAILED.
type TooBroadError struct {
	Repo, Why string
}

func (e *TooBroadError) Error() string {
	return fmt.Sprintf("git repository %s: its token is refused: %s", e.Repo, e.Why)
}

func (e *TooBroadError) Unwrap() error {
	return runbox.Errorf(runbox.EGitHubAuthFailed,
		"this repository's token has broader rights than runbox accepts; the operator must replace it with one limited to this repository")
}
