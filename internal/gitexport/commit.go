package gitexport

import (
	"bytes"
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"path"
	"strings"
	"unicode"
	"unicode/utf8"

	"github.com/runbox-dev/runbox"
	"github.com/runbox-dev/runbox/internal/audit"
	"github.com/runbox-dev/runbox/internal/gitexport/rules"
	"github.com/runbox-dev/runbox/internal/mcp"
	"github.com/runbox-dev/runbox/internal/runs"
)

// CommitInput are commit_and_push_to_github's arguments.
type CommitInput struct {
	RepoID string    `json:"repo_id" jsonschema:"the repository, as the operator named it"`
	Branch string    `json:"branch" jsonschema:"the branch to commit to, made from the base branch when new; it must match the repository's allowed patterns and cannot be the base branch"`
	Files  mcp.Files `json:"files,omitempty" jsonschema:"the files to commit, as a list [{path, content, encoding?}] or a record path → content (at most 10, each at most 500 KB; paths relative to the repository's root, of letters, digits, '.', '_', '/', '-'); or conversationId and paths instead"`
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
	fs, err := s.gather(ctx, r, in, conv)
	if err != nil {
		return CommitOutput{}, err
	}
	// A token that may not push (or may do too much) is refused here,
	// before anything is written.
	if _, err := r.check(ctx, s.clock.Now(), false); err != nil {
		s.logForge(r, err)
		return CommitOutput{}, err
	}

	verify, err := s.mayPush(ctx, r, in.Branch, client)
	if err != nil {
		return CommitOutput{}, err
	}

	ctx, cancel := context.WithTimeout(ctx, callTimeout)
	defer cancel()
	call, err := s.begin(ctx, client, r, in, conv, fs)
	if err != nil {
		return CommitOutput{}, err
	}
	out, err := s.push(ctx, r, in, client, conv, call, message, title, fs, verify)
	if call != nil {
		call.End(ctx, errorCode(err), "")
	}
	if err != nil {
		s.logForge(r, err)
		return CommitOutput{}, err
	}
	return out, nil
}

// errNotOwner refuses a push to a branch the caller did not make. It
// names no client, and reads the same whether another client made the
// branch or someone outside runbox did.
var errNotOwner = runbox.Errorf(runbox.EPermissionDenied,
	"this branch was not made by this client (another client made it, or it was made outside runbox): commit to a branch of your own")

// mayPush decides whether client may add to branch. A branch belongs to
// the client that made it, as recorded when it was made (in lower case:
// forges on case-insensitive file systems read Runbox/X as runbox/x): the
// recorded client may push, any other is refused. A branch with no record
// (made outside runbox, or before records were kept, or its record lost)
// is checked on the forge as the push is made (verify): if it exists, its
// tip must be a commit runbox made for client (Commit.Owner).
func (s *Service) mayPush(ctx context.Context, r *repo, branch, client string) (verify bool, err error) {
	owner, err := s.owners.BranchOwner(ctx, r.name, strings.ToLower(branch))
	switch {
	case err != nil:
		return false, err
	case owner == "":
		return true, nil
	case owner != client:
		return false, errNotOwner
	}
	return false, nil
}

// trailerClient starts the trailers runbox writes after a commit's
// message, naming the client the commit was made for.
const trailerClient = "Runbox-Client: "

// madeFor returns the client a commit runbox made names in its trailers,
// or "". runbox writes them as the message's last paragraph, after the
// client's own text, so no client can write that paragraph.
func madeFor(message string) string {
	message = strings.TrimRight(message, "\n")
	i := strings.LastIndex(message, "\n\n")
	if i < 0 {
		return ""
	}
	first, _, _ := strings.Cut(message[i+2:], "\n")
	client, ok := strings.CutPrefix(first, trailerClient)
	if !ok {
		return ""
	}
	return client
}

func (s *Service) push(ctx context.Context, r *repo, in CommitInput, client, conv string, call *audit.Call,
	message, title string, fs []File, verify bool) (CommitOutput, error) {
	trailers := []string{trailerClient + client}
	if conv != "" {
		trailers = append(trailers, "Runbox-Conversation: "+conv)
	}
	if call != nil {
		trailers = append(trailers, "Runbox-Audit-Call: "+call.ID())
	}
	c := Commit{
		Branch: in.Branch, Base: r.cfg.BaseBranch, Files: fs,
		Message: message + "\n\n" + strings.Join(trailers, "\n") + "\n",
		Author:  s.author, Committer: s.committer, When: s.clock.Now(),
	}
	if verify {
		c.Owner = client
	}
	sha, err := r.forge.Push(ctx, c)
	if err != nil {
		return CommitOutput{}, err
	}
	if verify {
		// The branch is the caller's now, whatever else its tip says
		// later. Should the record fail, the tip's trailer still says
		// it.
		owner, err := s.owners.SetBranchOwner(ctx, r.name, strings.ToLower(in.Branch), client)
		if err != nil || owner != client {
			s.log.Warn("the branch's maker was not recorded", "repo", r.cfg.ID, "branch", in.Branch, "err", err)
		}
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
func (s *Service) gather(ctx context.Context, r *repo, in CommitInput, conv string) ([]File, error) {
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
		fs, err = inlineFiles(r, in.Files)
	} else {
		fs, err = s.conversationFiles(ctx, r, conv, in.Paths, in.TargetDir)
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

// checkPath holds a path of the repository to the gateway's rules, the
// built-in forbidden names and the repository's forbidden_paths: a path
// that is malformed or climbs, or names one of the gateway's own four
// (.env*, .git* …), is PATH_TRAVERSAL as the gateway's clients know it;
// one that names the rest of what runbox does not commit (CI files,
// forbidden_paths) is PERMISSION_DENIED.
func checkPath(r *repo, p string) error {
	err := rules.Path(p, r.cfg.ForbiddenPaths...)
	if fe, ok := errors.AsType[*rules.ForbiddenError](err); ok && !fe.Gateway {
		return runbox.Errorf(runbox.EPermissionDenied, "%s", err.Error())
	}
	if err != nil {
		return runbox.Errorf(runbox.EPathTraversal, "%s", err.Error())
	}
	return nil
}

func tooLarge(p string, size int64) error {
	return runbox.Errorf(runbox.EFileSizeExceeded, "%s is %d bytes; a file may be at most %d", p, size, MaxFileBytes)
}

func inlineFiles(r *repo, in mcp.Files) ([]File, error) {
	fs := make([]File, 0, len(in))
	for _, f := range in {
		if err := checkPath(r, f.Path); err != nil {
			return nil, err
		}
		data, err := f.Data(MaxFileBytes)
		if err != nil {
			return nil, err
		}
		fs = append(fs, File{Path: f.Path, Data: data})
	}
	return fs, nil
}

// conversationFiles reads files of the caller's conversation (never
// another client's: the key is the caller's), each checked as a path of
// the repository before it is read, and bounded as inline files are.
func (s *Service) conversationFiles(ctx context.Context, r *repo, conv string, names []string, targetDir string) ([]File, error) {
	key, err := runs.ConversationKey(ctx, conv)
	if err != nil {
		return nil, err
	}
	if targetDir = strings.Trim(targetDir, "/"); targetDir != "" {
		if err := checkPath(r, targetDir); err != nil {
			return nil, err
		}
	}
	type entry struct{ name, repoPath string }
	entries := make([]entry, 0, len(names))
	for _, n := range names {
		name, err := runbox.CleanFileName(n)
		if err != nil {
			return nil, runbox.Errorf(runbox.EPathTraversal, "paths must name files under /data")
		}
		p := name
		if targetDir != "" {
			p = targetDir + "/" + name
		}
		if err := checkPath(r, p); err != nil {
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
