// Package gitexport hands a conversation's work over for review: it
// commits files (sent inline, or taken from the conversation's /data) to
// a branch of a repository on a git forge, as one commit, opens a pull
// request, and reads files back. It answers the security gateway's tools
// (commit_and_push_to_github, read_github_file) with its names, limits
// and error codes.
//
// Repositories are the operator's (GIT_REPOS_FILE): each with one token
// that never leaves the server, the clients that may use it, the branch
// patterns they may push to, the paths they may not write besides the
// built-in ones (rules), and a base branch nothing is pushed to directly.
// A branch belongs to the client that made it (Owners, and the commits'
// trailers). Every token is checked at start, in /readyz and before a
// commit for what it may do: push, and nothing broader where the forge
// says.
package gitexport

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/jonboulle/clockwork"

	"github.com/runbox-dev/runbox"
	"github.com/runbox-dev/runbox/internal/audit"
	"github.com/runbox-dev/runbox/internal/auth"
)

// The gateway's limits.
const (
	MaxFiles     = 10
	MaxFileBytes = 500 << 10 // 500 KiB per file, inline or from /data
	MaxMessage   = 200       // characters of commit_message
	MaxTitle     = 100       // characters of pr_title
	// MaxReadBytes bounds what read_github_file returns: GitHub's
	// contents API returns files of up to 1 MB inline.
	MaxReadBytes = 1_000_000
)

const userAgent = "runbox"

// How long a check of a token holds, and how long one may take.
const (
	checkTTL     = time.Minute
	checkTimeout = 15 * time.Second
	// callTimeout bounds a commit (fetch, push, pull request).
	callTimeout = 2 * time.Minute
)

// Service commits to and reads from the configured repositories.
type Service struct {
	repos     map[string]*repo
	owners    Owners
	files     runbox.FileStore
	audit     *audit.Recorder
	author    Signature
	committer Signature
	clock     clockwork.Clock
	log       *slog.Logger
}

// repo is a configured repository and what the last check of its token
// found.
type repo struct {
	cfg   *Repo
	forge Forge
	// name is the repository as branch records name it: its address in
	// lower case, so that two repo_ids of one repository share them.
	name string

	mu        sync.Mutex
	checkedAt time.Time // of the last check with a definite answer
	access    Access
	err       error
}

// Owners record which client made each branch, for every api replica
// (store.Git).
type Owners interface {
	// BranchOwner returns the client recorded for a branch, or "".
	BranchOwner(ctx context.Context, repo, branch string) (string, error)
	// SetBranchOwner records client for a branch unless one is recorded,
	// and returns the one recorded.
	SetBranchOwner(ctx context.Context, repo, branch, client string) (string, error)
}

// Options are what New needs.
type Options struct {
	Git *Git
	// Owners keep branches to the clients that made them.
	Owners Owners
	Files  runbox.FileStore
	// Audit records every push before it is made; nil only in tests of
	// the forges.
	Audit *audit.Recorder
	// HTTPClient reaches the forges; nil: one that follows redirects only
	// within a host.
	HTTPClient *http.Client
	// TempDir holds commits while they are built; empty: os.TempDir().
	TempDir string
	Clock   clockwork.Clock
	Log     *slog.Logger
}

// New builds the service's forges. It calls no forge: Start does.
func New(o Options) (*Service, error) {
	hc := o.HTTPClient
	if hc == nil {
		hc = &http.Client{Transport: http.DefaultTransport.(*http.Transport).Clone(), CheckRedirect: sameHost}
	}
	if o.Owners == nil {
		return nil, errors.New("gitexport: no record of branch owners")
	}
	s := &Service{
		repos: map[string]*repo{}, owners: o.Owners, files: o.Files, audit: o.Audit,
		author: o.Git.Author, committer: o.Git.Committer, clock: o.Clock, log: o.Log,
	}
	if s.clock == nil {
		s.clock = clockwork.NewRealClock()
	}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	s.log = s.log.With("component", "git")
	tmp := cmp.Or(o.TempDir, os.TempDir())
	for id, cfg := range o.Git.Repos {
		var f Forge
		var err error
		switch cfg.Forge {
		case ForgeGitHub:
			f, err = newGitHub(cfg, hc, tmp)
		case ForgeGitea:
			f, err = newGitea(cfg, hc, tmp)
		default:
			err = fmt.Errorf("repository %s: unknown forge %q", id, cfg.Forge)
		}
		if err != nil {
			return nil, err
		}
		u, err := url.Parse(cfg.URL)
		if err != nil {
			return nil, fmt.Errorf("repository %s: %w", id, err)
		}
		name := strings.ToLower(u.Host + strings.TrimSuffix(strings.TrimSuffix(u.Path, "/"), ".git"))
		s.repos[id] = &repo{cfg: cfg, forge: f, name: name}
	}
	return s, nil
}

// sameHost keeps a forge's redirects on its host: a token never follows
// one elsewhere.
func sameHost(req *http.Request, via []*http.Request) error {
	if len(via) >= 3 || req.URL.Host != via[0].URL.Host {
		return http.ErrUseLastResponse
	}
	return nil
}

// Start checks every repository's token. A token refused for its breadth
// stops the start (the error says which and why); any other failure is
// logged, and the repository is checked again before it is used.
func (s *Service) Start(ctx context.Context) error {
	ids := s.ids()
	type result struct {
		a   Access
		err error
	}
	results := make([]result, len(ids))
	var wg sync.WaitGroup
	for i, id := range ids {
		wg.Go(func() {
			a, err := s.repos[id].check(ctx, s.clock.Now(), true)
			results[i] = result{a, err}
		})
	}
	wg.Wait()
	var refused []error
	for i, id := range ids {
		r, a, err := s.repos[id], results[i].a, results[i].err
		var broad *TooBroadError
		switch {
		case errors.As(err, &broad):
			refused = append(refused, broad)
		case err != nil:
			s.log.Warn("git repository cannot be used now", "repo", id, "err", runbox.ErrorMessage(err))
			s.logForge(r, err)
		default:
			s.log.Info("git repository ready", "repo", id, "forge", r.cfg.Forge, "branches", r.cfg.AllowedBranches)
			if !a.Expires.IsZero() && a.Expires.Sub(s.clock.Now()) < 7*24*time.Hour {
				s.log.Warn("git token expires soon", "repo", id, "expires", a.Expires)
			}
		}
	}
	return errors.Join(refused...)
}

// Ready is the /readyz check: it fails while a repository's token is
// refused (expired, without push, too broad), which the operator must
// fix. A forge that does not answer is logged but does not fail it: no
// replica would do better, and runs do not need the forge.
func (s *Service) Ready(ctx context.Context) error {
	var errs []error
	for _, id := range s.ids() {
		r := s.repos[id]
		if _, err := r.check(ctx, s.clock.Now(), false); err != nil {
			if transient(err) {
				s.logForge(r, err)
				continue
			}
			errs = append(errs, fmt.Errorf("git repository %s: %s", id, runbox.ErrorMessage(err)))
		}
	}
	return errors.Join(errs...)
}

func (s *Service) ids() []string {
	ids := make([]string, 0, len(s.repos))
	for id := range s.repos {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	return ids
}

// check returns what the token may do, asking the forge when the last
// definite answer is older than checkTTL (or force). A forge that does not
// answer leaves the last answer in place.
func (r *repo) check(ctx context.Context, now time.Time, force bool) (Access, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !force && !r.checkedAt.IsZero() && now.Sub(r.checkedAt) < checkTTL {
		return r.access, r.err
	}
	ctx, cancel := context.WithTimeout(ctx, checkTimeout)
	defer cancel()
	a, err := r.forge.Check(ctx)
	if err != nil && transient(err) {
		return a, err
	}
	r.checkedAt, r.access, r.err = now, a, err
	return a, err
}

// transient reports an error that says nothing of the token: the forge
// did not answer, or asked to slow down.
func transient(err error) bool {
	switch runbox.ErrorCode(err) {
	case runbox.EUnavailable, runbox.ERateLimitExceeded, runbox.EInternal:
		return true
	}
	return false
}

// logForge logs what a forge said, with the repository's token scrubbed
// from it should the forge have echoed it.
func (s *Service) logForge(r *repo, err error) {
	var fe *forgeError
	if !errors.As(err, &fe) && runbox.ErrorCode(err) != runbox.EInternal {
		return
	}
	msg := err.Error()
	if fe != nil {
		msg = fe.err.Error()
	}
	msg = strings.ReplaceAll(msg, r.cfg.Token.Reveal(), "[redacted]")
	attrs := []any{"repo", r.cfg.ID, "err", msg}
	if fe != nil {
		attrs = append(attrs, "op", fe.op, "status", fe.status)
	}
	s.log.Warn("forge call failed", attrs...)
}

// repoFor returns the repository id names, if the caller may use it. An
// unknown repository and another client's answer alike, so that a client
// learns nothing of repositories it may not use.
func (s *Service) repoFor(ctx context.Context, id string) (*repo, string, error) {
	client := cmp.Or(auth.Client(ctx), runbox.DefaultClient)
	r, ok := s.repos[id]
	if !ok || !slices.Contains(r.cfg.Clients, client) {
		return nil, client, runbox.Errorf(runbox.EInvalidRepo, "repo_id %q is not a repository this client may use", cutText(id, 64))
	}
	return r, client, nil
}

func cutText(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n] + "…"
}
