package gitexport

import (
	"context"
	"fmt"
	"net/http"
	"time"

	"github.com/runbox-dev/runbox"
)

// Forge is a repository on a git forge, reached with its token. Two
// adapters: GitHub (google/go-github) and Gitea/Forgejo (the Gitea SDK);
// both push through git's smart HTTP protocol (gitRemote).
type Forge interface {
	// Check asks the forge what the token may do on the repository. It
	// fails when the token may not push, or may do more than runbox needs
	// where the forge says so (ErrTooBroad in its chain).
	Check(ctx context.Context) (Access, error)
	// Push writes c as one commit and returns its hash.
	Push(ctx context.Context, c Commit) (string, error)
	// OpenPullRequest opens a pull request from head into base, or finds
	// the one open already, and returns its web address.
	OpenPullRequest(ctx context.Context, head, base, title, body string) (string, error)
	// ReadFile returns a file of branch; one larger than limit is
	// EFileSizeExceeded, one that is not there ENotFound.
	ReadFile(ctx context.Context, branch, path string, limit int64) ([]byte, error)
}

// Access is what a check found out about a token.
type Access struct {
	// Push: the token may push to the repository.
	Push bool
	// Scopes are a classic GitHub token's (X-OAuth-Scopes); nil for the
	// forges and tokens that do not say.
	Scopes []string
	// Expires is when the token stops working, where the forge says.
	Expires time.Time
}

// forgeError is a forge's answer a client gets only as its code and a
// sentence of ours: the forge's own words (err) are logged.
type forgeError struct {
	op         string // "push", "fetch", "read", "pull request", "check"
	status     int    // the HTTP status; 0 when none came
	retryAfter time.Duration
	err        error
}

func (e *forgeError) Error() string {
	return fmt.Sprintf("forge %s: status %d: %v", e.op, e.status, e.err)
}

// Unwrap gives the client's view of the error, so that runbox.ErrorCode
// and ErrorMessage find it.
func (e *forgeError) Unwrap() error { return e.public() }

func (e *forgeError) public() *runbox.Error {
	switch e.status {
	case http.StatusUnauthorized:
		return runbox.Errorf(runbox.EGitHubAuthFailed,
			"the forge refused this repository's token (expired or revoked?); the operator must replace it")
	case http.StatusForbidden:
		return runbox.Errorf(runbox.EPermissionDenied, "this repository's token may not %s here", verb(e.op))
	case http.StatusNotFound:
		return runbox.Errorf(runbox.EPermissionDenied, "the repository is not there, or its token may not see it")
	case http.StatusTooManyRequests:
		return runbox.Limited(runbox.ERateLimitExceeded, max(e.retryAfter, time.Second),
			"the forge's rate limit for this repository's token is reached; retry later")
	}
	return runbox.Errorf(runbox.EUnavailable, "the forge did not answer the %s; try again later", e.op)
}

func verb(op string) string {
	switch op {
	case "push":
		return "push"
	case "fetch", "read":
		return "read"
	case "pull request":
		return "open pull requests"
	}
	return op
}
