// Package gitexport hands a conversation's work over for review: it
// commits files (sent inline, or taken from the conversation's /data) to
// a branch of a repository on a git forge, as one commit, opens a pull
// request, and reads files back. It answers the security gateway's tools
// (commit_and_push_to_github, read_github_file) with its names, limits
// and error codes.
//
// Repositories are the operator's (GIT_REPOS_FILE): each with one token
// that never leaves the server, the clients that may use it, the branch
// patterns they may push to, and a base branch nothing is pushed to
// directly. Every token is checked at start, in /readyz and before a
// commit for what it may do: push, and nothing broader where the forge
// says.
package gitexport

import (
	"bytes"
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path"
	"slices"
	"strings"
	"sync"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/jonboulle/clockwork"

	"github.com/runbox-dev/runbox"
	"github.com/runbox-dev/runbox/internal/audit"
	"github.com/runbox-dev/runbox/internal/auth"
	"github.com/runbox-dev/runbox/internal/config"
	"github.com/runbox-dev/runbox/internal/files"
	"github.com/runbox-dev/runbox/internal/gitexport/rules"
	"github.com/runbox-dev/runbox/internal/runs"
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
	files     runbox.FileStore
	audit     *audit.Recorder
	author    config.Signature
	committer config.Signature
	clock     clockwork.Clock
	log       *slog.Logger
}

// repo is a configured repository and what the last check of its token
// found.
type repo struct {
	cfg   *config.GitRepo
	forge Forge

	mu        sync.Mutex
	checkedAt time.Time // of the last check with a definite answer
	access    Access
	err       error
}

// Options are what New needs.
type Options struct {
	Git   *config.Git
	Files runbox.FileStore
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
	s := &Service{
		repos: map[string]*repo{}, files: o.Files, audit: o.Audit,
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
		case config.ForgeGitHub:
			f, err = newGitHub(cfg, hc, tmp)
		case config.ForgeGitea:
			f, err = newGitea(cfg, hc, tmp)
		default:
			err = fmt.Errorf("repository %s: unknown forge %q", id, cfg.Forge)
		}
		if err != nil {
			return nil, err
		}
		s.repos[id] = &repo{cfg: cfg, forge: f}
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

// FileInput is a file sent inline.
type FileInput struct {
	Path     string `json:"path" jsonschema:"where the file goes, relative to the repository's root (letters, digits, '.', '_', '/', '-')"`
	Content  string `json:"content" jsonschema:"the file's content: text, or base64 with encoding base64"`
	Encoding string `json:"encoding,omitempty" jsonschema:"utf-8 (the default) or base64 (for binary files)"`
}

// CommitInput are commit_and_push_to_github's arguments.
type CommitInput struct {
	RepoID string      `json:"repo_id" jsonschema:"the repository, as the operator named it"`
	Branch string      `json:"branch" jsonschema:"the branch to commit to, made from the base branch when new; it must match the repository's allowed patterns and cannot be the base branch"`
	Files  []FileInput `json:"files,omitempty" jsonschema:"the files to commit (at most 10, each at most 500 KB); or conversationId and paths instead"`
	// runbox's addition: files of a conversation's /data.
	ConversationID string   `json:"conversationId,omitempty" jsonschema:"commit files of this conversation's /data (with paths) instead of files"`
	SessionID      string   `json:"session_id,omitempty" jsonschema:"another name for conversationId"`
	Paths          []string `json:"paths,omitempty" jsonschema:"the conversation's files to commit, as /data paths or names (at most 10, each at most 500 KB); each keeps its name in the repository"`
	TargetDir      string   `json:"target_dir,omitempty" jsonschema:"a folder of the repository to put the conversation's files in (default: its root)"`
	CommitMessage  string   `json:"commit_message" jsonschema:"the commit's message, at most 200 characters"`
	CreatePR       bool     `json:"create_pr,omitempty" jsonschema:"open a pull request from the branch into the base branch (default false)"`
	PRTitle        string   `json:"pr_title,omitempty" jsonschema:"the pull request's title, at most 100 characters (default: the message's first line)"`
}

// CommittedFile is a file of a commit.
type CommittedFile struct {
	Path string `json:"path"`
	Size int    `json:"size"`
}

// CommitOutput is commit_and_push_to_github's answer.
type CommitOutput struct {
	Success   bool            `json:"success"`
	CommitSHA string          `json:"commit_sha"`
	PRURL     string          `json:"pr_url,omitempty"`
	RepoID    string          `json:"repo_id"`
	Branch    string          `json:"branch"`
	Files     []CommittedFile `json:"files"`
}

// Commit writes the files as one commit on the branch and, when asked,
// opens a pull request into the base branch. Everything is checked before
// the forge is asked anything; the push is audited before it is made.
func (s *Service) Commit(ctx context.Context, in CommitInput) (CommitOutput, error) {
	r, client, err := s.repoFor(ctx, in.RepoID)
	if err != nil {
		return CommitOutput{}, err
	}
	if err := s.checkBranch(r, in.Branch, true); err != nil {
		return CommitOutput{}, err
	}
	message, title, err := messages(in)
	if err != nil {
		return CommitOutput{}, err
	}
	conv := cmp.Or(in.ConversationID, in.SessionID)
	fs, err := s.gather(ctx, in, conv)
	if err != nil {
		return CommitOutput{}, err
	}
	// A token that may not push (or may do too much) is refused here,
	// before anything is written.
	if _, err := r.check(ctx, s.clock.Now(), false); err != nil {
		s.logForge(r, err)
		return CommitOutput{}, err
	}

	ctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	call, err := s.begin(ctx, client, r, in, conv, fs)
	if err != nil {
		return CommitOutput{}, err
	}
	out, err := s.push(ctx, r, in, client, conv, call, message, title, fs)
	if call != nil {
		call.End(ctx, errorCode(err), "")
	}
	if err != nil {
		s.logForge(r, err)
		return CommitOutput{}, err
	}
	return out, nil
}

func (s *Service) push(ctx context.Context, r *repo, in CommitInput, client, conv string, call *audit.Call,
	message, title string, fs []File) (CommitOutput, error) {
	trailers := []string{"Runbox-Client: " + client}
	if conv != "" {
		trailers = append(trailers, "Runbox-Conversation: "+conv)
	}
	if call != nil {
		trailers = append(trailers, "Runbox-Audit-Call: "+call.ID())
	}
	sha, err := r.forge.Push(ctx, Commit{
		Branch: in.Branch, Base: r.cfg.BaseBranch, Files: fs,
		Message: message + "\n\n" + strings.Join(trailers, "\n") + "\n",
		Author:  s.author, Committer: s.committer, When: s.clock.Now(),
	})
	if err != nil {
		return CommitOutput{}, err
	}
	out := CommitOutput{Success: true, CommitSHA: sha, RepoID: r.cfg.ID, Branch: in.Branch, Files: make([]CommittedFile, len(fs))}
	for i, f := range fs {
		out.Files[i] = CommittedFile{Path: f.Path, Size: len(f.Data)}
	}
	if !in.CreatePR {
		return out, nil
	}
	url, err := r.forge.OpenPullRequest(ctx, in.Branch, r.cfg.BaseBranch, title, prBody(client, conv, out.Files))
	if err != nil {
		// The commit is on the branch; say so, with what failed.
		return CommitOutput{}, withMessageSuffix(err, fmt.Sprintf(" (commit %s is on branch %s; the pull request was not opened)", sha, in.Branch))
	}
	out.PRURL = url
	return out, nil
}

// withMessageSuffix returns err's client error with suffix added to its
// message, keeping err (for the log) in the chain.
func withMessageSuffix(err error, suffix string) error {
	e, ok := errors.AsType[*runbox.Error](err)
	if !ok {
		return err
	}
	return &wrapped{public: &runbox.Error{Code: e.Code, Message: e.Message + suffix, RetryAfter: e.RetryAfter}, err: err}
}

type wrapped struct {
	public *runbox.Error
	err    error
}

func (w *wrapped) Error() string   { return w.err.Error() }
func (w *wrapped) Unwrap() []error { return []error{w.public, w.err} }

// begin records the push about to be made: the repository, the branch,
// and each file's path, size and SHA-256 (never its content).
func (s *Service) begin(ctx context.Context, client string, r *repo, in CommitInput, conv string, fs []File) (*audit.Call, error) {
	if s.audit == nil {
		return nil, nil
	}
	list := make([]any, len(fs))
	for i, f := range fs {
		sum := sha256.Sum256(f.Data)
		list[i] = map[string]any{"path": f.Path, "size": len(f.Data), "sha256": hex.EncodeToString(sum[:])}
	}
	return s.audit.Begin(ctx, audit.Entry{
		Client: client, Route: "git push", Conversation: conv,
		Params: map[string]any{
			"repo_id": r.cfg.ID, "forge": r.cfg.Forge, "branch": in.Branch, "base_branch": r.cfg.BaseBranch,
			"files": list, "create_pr": in.CreatePR,
		},
	})
}

func errorCode(err error) string {
	if err == nil {
		return ""
	}
	return runbox.ErrorCode(err)
}

// checkBranch holds a branch to the gateway's rule and the repository's
// patterns; a push (write) may not go to the base branch. A read may
// also name the base branch.
func (s *Service) checkBranch(r *repo, branch string, write bool) error {
	if err := rules.Branch(branch); err != nil {
		return runbox.Errorf(runbox.EInvalidBranch, "%s", err.Error())
	}
	if branch == r.cfg.BaseBranch {
		if write {
			return runbox.Errorf(runbox.EInvalidBranch,
				"%s is the base branch, which changes reach only through a pull request: commit to a branch matching %s with create_pr",
				branch, strings.Join(r.cfg.AllowedBranches, " or "))
		}
		return nil
	}
	if !rules.MatchBranch(r.cfg.AllowedBranches, branch) {
		return runbox.Errorf(runbox.EInvalidBranch, "the branch must match %s", strings.Join(r.cfg.AllowedBranches, " or "))
	}
	return nil
}

// messages checks the commit message and the pull request's title (the
// message's first line when none is given).
func messages(in CommitInput) (message, title string, err error) {
	message = strings.TrimSpace(strings.ReplaceAll(in.CommitMessage, "\r\n", "\n"))
	switch {
	case message == "":
		return "", "", runbox.Errorf(runbox.EInvalid, "commit_message is required")
	case utf8.RuneCountInString(message) > MaxMessage:
		return "", "", runbox.Errorf(runbox.EInvalid, "commit_message must be at most %d characters", MaxMessage)
	case !printable(message, true):
		return "", "", runbox.Errorf(runbox.EInvalid, "commit_message must be text without control characters")
	}
	title, _, _ = strings.Cut(message, "\n")
	if in.PRTitle != "" {
		title = strings.TrimSpace(in.PRTitle)
	}
	switch {
	case utf8.RuneCountInString(title) > MaxTitle:
		return "", "", runbox.Errorf(runbox.EInvalid, "pr_title must be at most %d characters", MaxTitle)
	case title == "" || !printable(title, false):
		return "", "", runbox.Errorf(runbox.EInvalid, "pr_title must be one line of text")
	}
	return message, title, nil
}

func printable(s string, lines bool) bool {
	if !utf8.ValidString(s) {
		return false
	}
	for _, r := range s {
		if unicode.IsControl(r) && !(lines && (r == '\n' || r == '\t')) {
			return false
		}
	}
	return true
}

// gather checks and loads the files: inline ones, or the conversation's.
func (s *Service) gather(ctx context.Context, in CommitInput, conv string) ([]File, error) {
	inline, fromConv := len(in.Files) > 0, conv != "" || len(in.Paths) > 0
	switch {
	case inline && fromConv:
		return nil, runbox.Errorf(runbox.EInvalid, "send files, or conversationId with paths, not both")
	case !inline && (conv == "" || len(in.Paths) == 0):
		return nil, runbox.Errorf(runbox.EInvalid, "files, or conversationId with paths, are required")
	case len(in.Files) > MaxFiles || len(in.Paths) > MaxFiles:
		return nil, runbox.Errorf(runbox.EInvalid, "a commit holds at most %d files", MaxFiles)
	}
	var fs []File
	var err error
	if inline {
		fs, err = inlineFiles(in.Files)
	} else {
		fs, err = s.conversationFiles(ctx, conv, in.Paths, in.TargetDir)
	}
	if err != nil {
		return nil, err
	}
	seen := map[string]bool{}
	for _, f := range fs {
		if seen[f.Path] {
			return nil, runbox.Errorf(runbox.EInvalid, "%s is given twice", f.Path)
		}
		seen[f.Path] = true
	}
	for _, f := range fs {
		for dir := path.Dir(f.Path); dir != "."; dir = path.Dir(dir) {
			if seen[dir] {
				return nil, runbox.Errorf(runbox.EInvalid, "%s is both a file and a folder in this commit", dir)
			}
		}
	}
	return fs, nil
}

func checkPath(p string) error {
	if err := rules.Path(p); err != nil {
		return runbox.Errorf(runbox.EPathTraversal, "%s", err.Error())
	}
	return nil
}

func tooLarge(p string, size int64) error {
	return runbox.Errorf(runbox.EFileSizeExceeded, "%s is %d bytes; a file may be at most %d", p, size, MaxFileBytes)
}

func inlineFiles(in []FileInput) ([]File, error) {
	fs := make([]File, 0, len(in))
	for _, f := range in {
		if err := checkPath(f.Path); err != nil {
			return nil, err
		}
		var data []byte
		switch strings.ToLower(f.Encoding) {
		case "", "utf-8", "utf8", "text":
			if len(f.Content) > MaxFileBytes {
				return nil, tooLarge(f.Path, int64(len(f.Content)))
			}
			data = []byte(f.Content)
		case "base64":
			// Measured before decoding, so that an oversized file costs
			// nothing.
			if len(f.Content) > base64.StdEncoding.EncodedLen(MaxFileBytes)+4 {
				return nil, tooLarge(f.Path, int64(base64.StdEncoding.DecodedLen(len(f.Content))))
			}
			var err error
			if data, err = base64.StdEncoding.DecodeString(f.Content); err != nil {
				return nil, runbox.Errorf(runbox.EInvalid, "the content of %s is not valid base64", f.Path)
			}
			if len(data) > MaxFileBytes {
				return nil, tooLarge(f.Path, int64(len(data)))
			}
		default:
			return nil, runbox.Errorf(runbox.EInvalid, "encoding must be utf-8 or base64")
		}
		fs = append(fs, File{Path: f.Path, Data: data})
	}
	return fs, nil
}

// conversationFiles reads files of the caller's conversation (never
// another client's: the key is the caller's), each checked as a path of
// the repository before it is read, and bounded as inline files are.
func (s *Service) conversationFiles(ctx context.Context, conv string, names []string, targetDir string) ([]File, error) {
	key, err := runs.ConversationKey(ctx, conv)
	if err != nil {
		return nil, err
	}
	if targetDir = strings.Trim(targetDir, "/"); targetDir != "" {
		if err := checkPath(targetDir); err != nil {
			return nil, err
		}
	}
	type entry struct{ name, repoPath string }
	entries := make([]entry, 0, len(names))
	for _, n := range names {
		name, err := files.CleanName(n)
		if err != nil {
			return nil, runbox.Errorf(runbox.EPathTraversal, "paths must name files under /data")
		}
		p := name
		if targetDir != "" {
			p = targetDir + "/" + name
		}
		if err := checkPath(p); err != nil {
			return nil, err
		}
		entries = append(entries, entry{name, p})
	}
	fs := make([]File, 0, len(entries))
	for _, e := range entries {
		data, err := s.readConversationFile(ctx, key, e.name)
		if err != nil {
			return nil, err
		}
		fs = append(fs, File{Path: e.repoPath, Data: data})
	}
	return fs, nil
}

func (s *Service) readConversationFile(ctx context.Context, key, name string) ([]byte, error) {
	f, info, err := s.files.Open(ctx, key, name)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if info.Size > MaxFileBytes {
		return nil, tooLarge("/data/"+name, info.Size)
	}
	var b bytes.Buffer
	// The file may grow while it is read (a run is writing it): no more
	// than the limit is taken.
	if _, err := b.ReadFrom(io.LimitReader(f, MaxFileBytes+1)); err != nil {
		return nil, fmt.Errorf("read /data/%s: %w", name, err)
	}
	if b.Len() > MaxFileBytes {
		return nil, tooLarge("/data/"+name, int64(b.Len()))
	}
	return b.Bytes(), nil
}

func prBody(client, conv string, fs []CommittedFile) string {
	var b strings.Builder
	fmt.Fprintf(&b, "Opened through runbox by the client `%s`", client)
	if conv != "" {
		fmt.Fprintf(&b, " from the conversation `%s`", conv)
	}
	b.WriteString(".\n\nFiles:\n")
	for _, f := range fs {
		fmt.Fprintf(&b, "- `%s` (%d bytes)\n", f.Path, f.Size)
	}
	return b.String()
}

// ReadInput are read_github_file's arguments.
type ReadInput struct {
	RepoID   string `json:"repo_id" jsonschema:"the repository, as the operator named it"`
	FilePath string `json:"file_path" jsonschema:"the file, relative to the repository's root"`
	Branch   string `json:"branch,omitempty" jsonschema:"the branch to read (default: the repository's base branch, main unless configured)"`
}

// ReadOutput is read_github_file's answer.
type ReadOutput struct {
	Content string `json:"content"`
	Size    int    `json:"size"`
	// Encoding is utf-8 for text, base64 for anything else (Binary).
	Encoding string `json:"encoding"`
	Binary   bool   `json:"binary"`
	RepoID   string `json:"repo_id"`
	Branch   string `json:"branch"`
	Path     string `json:"path"`
}

// Read returns a file of the base branch or an allowed one, at most
// MaxReadBytes; text as it is, anything else as base64 with Binary set.
func (s *Service) Read(ctx context.Context, in ReadInput) (ReadOutput, error) {
	r, _, err := s.repoFor(ctx, in.RepoID)
	if err != nil {
		return ReadOutput{}, err
	}
	branch := cmp.Or(in.Branch, r.cfg.BaseBranch)
	if err := s.checkBranch(r, branch, false); err != nil {
		return ReadOutput{}, err
	}
	if err := checkPath(in.FilePath); err != nil {
		return ReadOutput{}, err
	}
	// A token refused for what it may do is not used at all; one that
	// only may not push still reads.
	if _, err := r.check(ctx, s.clock.Now(), false); err != nil && !transient(err) &&
		runbox.ErrorCode(err) != runbox.EPermissionDenied {
		return ReadOutput{}, err
	}
	ctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	data, err := r.forge.ReadFile(ctx, branch, in.FilePath, MaxReadBytes)
	if err != nil {
		s.logForge(r, err)
		return ReadOutput{}, err
	}
	out := ReadOutput{Size: len(data), RepoID: r.cfg.ID, Branch: branch, Path: in.FilePath, Encoding: "utf-8", Content: string(data)}
	if !utf8.Valid(data) || bytes.IndexByte(data, 0) >= 0 {
		out.Encoding, out.Binary, out.Content = "base64", true, base64.StdEncoding.EncodeToString(data)
	}
	return out, nil
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
