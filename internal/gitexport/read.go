package gitexport

import (
	"bytes"
	"cmp"
	"context"
	"encoding/base64"
	"unicode/utf8"

	"github.com/runbox-dev/runbox"
)

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
	if err := checkPath(r, in.FilePath); err != nil {
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
