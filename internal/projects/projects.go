// Package projects answers the security gateway's project tools: a
// project is a conversation of its client that runs a template's dev
// server (a background run in the template's image), reachable on a
// preview URL, rebuilding when files are written, and destroyed after
// SANDBOX_PROJECT_TTL. Its limits, path rules and error codes are the
// gateway's (SEED-CONTRACTS.md).
package projects

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"

	"github.com/runbox-dev/runbox"
	"github.com/runbox-dev/runbox/internal/link"
	"github.com/runbox-dev/runbox/internal/mcp"
	"github.com/runbox-dev/runbox/internal/preview"
	"github.com/runbox-dev/runbox/internal/runs"
)

// startTimeout bounds how long create_sandbox_for_project waits for the
// dev server to listen: the run's turn, its container's start, the first
// build.
const startTimeout = 90 * time.Second

// pollInterval is how often it looks.
const pollInterval = 200 * time.Millisecond

// Store keeps the projects and tells where their runs and sandboxes are
// (store.Projects, Runs and Executors: a *store.Store). Project returns
// runbox.ErrProjectNotFound for one that does not exist.
type Store interface {
	SaveProject(ctx context.Context, p runbox.Project) error
	Project(ctx context.Context, cid string) (runbox.Project, error)
	SetOwner(ctx context.Context, cid, executor string, ttl time.Duration) error
	Owner(ctx context.Context, cid string) (string, error)
	LiveExecutors(ctx context.Context) ([]runbox.ExecutorInfo, error)
	Run(ctx context.Context, id string) (runbox.Run, error)
	Executor(ctx context.Context, id string) (string, error)
}

// Service runs projects.
type Service struct {
	runs     *runs.Service
	store    Store
	link     link.Link
	previews *preview.Service
	redactor *Redactor
	ttl      time.Duration
	log      *slog.Logger
	now      func() time.Time
}

// Options configure a Service.
type Options struct {
	Runs     *runs.Service
	Store    Store
	Link     link.Link
	Previews *preview.Service
	Redactor *Redactor
	// TTL is how long a project lives (SANDBOX_PROJECT_TTL).
	TTL    time.Duration
	Logger *slog.Logger
}

// New returns a Service.
func New(o Options) *Service {
	return &Service{runs: o.Runs, store: o.Store, link: o.Link, previews: o.Previews, redactor: o.Redactor,
		ttl: o.TTL, log: o.Logger.With("component", "projects"), now: time.Now}
}

// CreateInput are create_sandbox_for_project's arguments.
type CreateInput struct {
	ProjectName  string    `json:"project_name" jsonschema:"1 to 50 letters, digits, '_' or '-'"`
	Template     string    `json:"template" jsonschema:"react, next, vue or node (as installed; an error lists what is)"`
	InitialFiles mcp.Files `json:"initial_files,omitempty" jsonschema:"a record path → content, or a list [{path, content, encoding?}]: at most 20 files of at most 1 MB each; relative paths, no '..', none of .env*, .git*, node_modules*, .codesandbox*"`
}

// Created is create_sandbox_for_project's result.
type Created struct {
	SandboxID   string    `json:"sandbox_id"`
	PreviewURL  string    `json:"preview_url"`
	ProjectName string    `json:"project_name"`
	Template    string    `json:"template"`
	ExpiresAt   time.Time `json:"expires_at"`
}

// Create makes a project: its files, its dev server, a preview URL once
// the server listens.
func (s *Service) Create(ctx context.Context, in CreateInput) (Created, error) {
	if err := checkProjectName(in.ProjectName); err != nil {
		return Created{}, err
	}
	files, err := checkFiles(in.InitialFiles, MaxInitialFiles, MaxInitialFileBytes)
	if err != nil {
		return Created{}, err
	}
	tpl, executors, err := s.template(ctx, in.Template)
	if err != nil {
		return Created{}, err
	}
	id := uuid.NewString()
	key, err := runs.ConversationKey(ctx, id)
	if err != nil {
		return Created{}, err
	}
	// A project is a new conversation of its client: it counts as one.
	if err := s.runs.AdmitConversation(ctx, key); err != nil {
		return Created{}, err
	}
	// The files go where the dev server will run: the conversation's
	// owner takes its run.
	executor := executors[rand.IntN(len(executors))]
	if len(files) > 0 {
		if err := s.link.WriteFiles(ctx, executor, key, linkFiles(files)); err != nil {
			return Created{}, fmt.Errorf("write the initial files: %w", err)
		}
	}
	if err := s.store.SetOwner(ctx, key, executor, s.ttl); err != nil {
		return Created{}, err
	}
	run, err := s.runs.SubmitTemplate(ctx, key, tpl, s.ttl)
	if err != nil {
		return Created{}, err
	}
	now := s.now()
	p := runbox.Project{Conversation: key, Name: in.ProjectName, Template: tpl.Name, Port: tpl.Port, RunID: run.ID,
		CreatedAt: now.UTC(), ExpiresAt: now.Add(s.ttl).UTC()}
	if err := s.store.SaveProject(ctx, p); err != nil {
		return Created{}, err
	}
	u, err := s.awaitServer(ctx, p)
	if err != nil {
		return Created{}, err
	}
	return Created{SandboxID: id, PreviewURL: u.URL, ProjectName: p.Name, Template: p.Template, ExpiresAt: p.ExpiresAt}, nil
}

// template finds an installed template and the executors that offer it.
func (s *Service) template(ctx context.Context, name string) (runbox.Template, []string, error) {
	infos, err := s.store.LiveExecutors(ctx)
	if err != nil {
		return runbox.Template{}, nil, err
	}
	var (
		found     runbox.Template
		executors []string
		available []string
	)
	for _, in := range infos {
		for _, t := range in.Templates {
			if !slices.Contains(available, t.Name) {
				available = append(available, t.Name)
			}
			if t.Name == name {
				found = t
				executors = append(executors, in.ID)
			}
		}
	}
	if len(executors) == 0 {
		slices.Sort(available)
		return runbox.Template{}, nil, &UnavailableError{Template: name, Names: available}
	}
	return found, executors, nil
}

// UnavailableError reports a template this installation lacks:
// template_unavailable, with the templates there are.
type UnavailableError struct {
	Template string
	Names    []string
}

func (e *UnavailableError) Error() string { return e.Unwrap().Error() }

// Unwrap is the error's code and message.
func (e *UnavailableError) Unwrap() error {
	return runbox.Errorf(runbox.ETemplateUnavailable, "template %q is not installed here; available: %s",
		shorten(e.Template), strings.Join(e.Names, ", "))
}

// Available lists the templates there are (the tool error's available).
func (e *UnavailableError) Available() []string { return e.Names }

// awaitServer waits until the project's dev server listens and returns a
// preview URL for it.
func (s *Service) awaitServer(ctx context.Context, p runbox.Project) (preview.URL, error) {
	ctx, cancel := context.WithTimeout(ctx, startTimeout)
	defer cancel()
	t := time.NewTicker(pollInterval)
	defer t.Stop()
	for {
		u, err := s.previews.Issue(ctx, p.Conversation, p.Port)
		if err == nil {
			return u, nil
		}
		if runbox.ErrorCode(err) != runbox.ENotListening {
			return preview.URL{}, err
		}
		run, err := s.store.Run(ctx, p.RunID)
		if err != nil {
			return preview.URL{}, err
		}
		if run.Status.Final() {
			return preview.URL{}, runbox.Errorf(runbox.ESandboxTimeout,
				"the project's dev server ended before it listened (%s); see get_sandbox_output build_output", run.Status)
		}
		select {
		case <-ctx.Done():
			if errors.Is(ctx.Err(), context.DeadlineExceeded) {
				return preview.URL{}, runbox.Errorf(runbox.ESandboxTimeout,
					"the project's dev server did not listen on port %d within %s", p.Port, startTimeout)
			}
			return preview.URL{}, ctx.Err()
		case <-t.C:
		}
	}
}

func linkFiles(files []File) []link.File {
	out := make([]link.File, len(files))
	for i, f := range files {
		out[i] = link.File{Path: f.Path, Data: f.Data}
	}
	return out
}

// project returns the caller's live project of a sandbox_id.
func (s *Service) project(ctx context.Context, sandboxID string) (string, runbox.Project, error) {
	id, err := checkSandboxID(sandboxID)
	if err != nil {
		return "", runbox.Project{}, err
	}
	key, err := runs.ConversationKey(ctx, id)
	if err != nil {
		return "", runbox.Project{}, notFound(sandboxID)
	}
	p, err := s.store.Project(ctx, key)
	if errors.Is(err, runbox.ErrProjectNotFound) {
		return "", runbox.Project{}, notFound(sandboxID)
	}
	return id, p, err
}

// WriteInput are write_files_to_sandbox's arguments.
type WriteInput struct {
	SandboxID string    `json:"sandbox_id" jsonschema:"the sandbox_id create_sandbox_for_project returned"`
	Files     mcp.Files `json:"files" jsonschema:"a record path → content, or a list [{path, content, encoding?}]: at most 10 files of at most 500 KB each; the same path rules as initial_files"`
}

// Written is write_files_to_sandbox's result.
type Written struct {
	Success      bool     `json:"success"`
	SandboxID    string   `json:"sandbox_id"`
	FilesWritten int      `json:"files_written"`
	Paths        []string `json:"paths"`
}

// Write writes files into a project; its dev server rebuilds.
func (s *Service) Write(ctx context.Context, in WriteInput) (Written, error) {
	id, p, err := s.project(ctx, in.SandboxID)
	if err != nil {
		return Written{}, err
	}
	if len(in.Files) == 0 {
		return Written{}, runbox.Errorf(runbox.EInvalid, "files is empty")
	}
	files, err := checkFiles(in.Files, MaxWriteFiles, MaxWriteFileBytes)
	if err != nil {
		return Written{}, err
	}
	executor, err := s.executor(ctx, p)
	if err != nil {
		return Written{}, err
	}
	if err := s.link.WriteFiles(ctx, executor, p.Conversation, linkFiles(files)); err != nil {
		if errors.Is(err, link.ErrGone) {
			return Written{}, runbox.Errorf(runbox.ESandboxNotFound, "the sandbox of %s has ended", id)
		}
		return Written{}, err
	}
	w := Written{Success: true, SandboxID: id, FilesWritten: len(files), Paths: make([]string, len(files))}
	for i, f := range files {
		w.Paths[i] = f.Path
	}
	return w, nil
}

// executor returns the executor that runs the project's dev server, or
// that will (its conversation's owner, until the run has started).
func (s *Service) executor(ctx context.Context, p runbox.Project) (string, error) {
	ex, err := s.store.Executor(ctx, p.RunID)
	if err != nil || ex != "" {
		return ex, err
	}
	return s.store.Owner(ctx, p.Conversation)
}

// Output types of get_sandbox_output.
const (
	ConsoleLog  = "console_log"
	BuildOutput = "build_output"
	PreviewURL  = "preview_url"
)

// OutputInput are get_sandbox_output's arguments.
type OutputInput struct {
	SandboxID  string `json:"sandbox_id" jsonschema:"the sandbox_id create_sandbox_for_project returned"`
	OutputType string `json:"output_type" jsonschema:"console_log (the dev server's log), build_output (the bundler's messages and errors) or preview_url"`
}

// Output is get_sandbox_output's result.
type Output struct {
	SandboxID  string `json:"sandbox_id"`
	OutputType string `json:"output_type"`
	Output     string `json:"output"`
	// Truncated says that earlier output was left out: the last 50 KB are
	// shown.
	Truncated bool `json:"truncated"`
	// Running says whether the dev server still runs.
	Running bool `json:"running"`
}

// Output returns a project's console log, build output or preview URL,
// its secrets redacted.
func (s *Service) Output(ctx context.Context, in OutputInput) (Output, error) {
	id, p, err := s.project(ctx, in.SandboxID)
	if err != nil {
		return Output{}, err
	}
	out := Output{SandboxID: id, OutputType: in.OutputType}
	switch in.OutputType {
	case PreviewURL:
		u, err := s.previews.Issue(ctx, p.Conversation, p.Port)
		if err != nil {
			return Output{}, err
		}
		out.Output, out.Running = u.URL, true
		return out, nil
	case ConsoleLog, BuildOutput:
	default:
		return Output{}, runbox.Errorf(runbox.EInvalid, "output_type must be %s, %s or %s", ConsoleLog, BuildOutput, PreviewURL)
	}
	text, dropped, running, err := s.tail(ctx, p, in.OutputType == ConsoleLog)
	if err != nil {
		return Output{}, err
	}
	out.Output, out.Truncated = lastBytes(s.redactor.Redact(text), MaxOutputBytes)
	out.Truncated = out.Truncated || dropped
	out.Running = running
	return out, nil
}

// tail returns the project's dev server's stdout (console) or stderr
// (build): live from its executor while it runs, else as its run
// recorded it.
func (s *Service) tail(ctx context.Context, p runbox.Project, console bool) (text string, dropped, running bool, err error) {
	executor, err := s.executor(ctx, p)
	if err != nil {
		return "", false, false, err
	}
	if executor != "" {
		o, err := s.link.Output(ctx, executor, p.RunID)
		switch {
		case err == nil:
			if console {
				return cutToLine(o.Stdout, o.StdoutDropped > 0), o.StdoutDropped > 0, true, nil
			}
			return cutToLine(o.Stderr, o.StderrDropped > 0), o.StderrDropped > 0, true, nil
		case !errors.Is(err, link.ErrNoRun) && !errors.Is(err, link.ErrGone):
			return "", false, false, err
		}
	}
	run, err := s.store.Run(ctx, p.RunID)
	if err != nil || run.Result == nil {
		return "", false, !run.Status.Final(), err
	}
	if console {
		return run.Result.Stdout, run.Result.StdoutTruncated, false, nil
	}
	return run.Result.Stderr, run.Result.StderrTruncated, false, nil
}

// cutToLine drops the partial first line of a tail whose start was cut: a
// secret cut in half would no longer look like one.
func cutToLine(s string, cut bool) string {
	if !cut {
		return s
	}
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		return s[i+1:]
	}
	return ""
}

// lastBytes returns the last n bytes of s, starting at a whole character.
func lastBytes(s string, n int) (string, bool) {
	if len(s) <= n {
		return s, false
	}
	s = s[len(s)-n:]
	for len(s) > 0 && !utf8.RuneStart(s[0]) {
		s = s[1:]
	}
	return s, true
}
