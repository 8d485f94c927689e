// Package commands serves the streaming sandbox server's clients: shell
// commands (execute_code and its family) run as runs of the runner
// "shell", on the queue, sandboxes, events, cancel and stdin every run
// has. An execution is its run; it belongs to the MCP session that
// started it (internal/sessions), whose executions run side by side in
// sandboxes that share one folder, /data.
package commands

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"time"

	"github.com/runbox-dev/runbox"
	"github.com/runbox-dev/runbox/internal/auth"
	"github.com/runbox-dev/runbox/internal/conversations"
	"github.com/runbox-dev/runbox/internal/mcp"
	"github.com/runbox-dev/runbox/internal/runs"
	"github.com/runbox-dev/runbox/internal/sessions"
)

// Language is the runner commands run on (runner-shell).
const Language = "shell"

// Limits bound the executions.
type Limits struct {
	// TimeoutSeconds is an execution's default and longest time
	// (SANDBOX_TIMEOUT).
	TimeoutSeconds int
	// PerSession and Total bound the executions running at once in a
	// session (SANDBOX_MAX_PER_SESSION) and in the deployment
	// (SANDBOX_MAX_CONCURRENT, 0: no limit).
	PerSession, Total int
	// MaxCommandBytes bounds a command (SANDBOX_MAX_CODE_BYTES).
	MaxCommandBytes int
}

// Bounds of waiting.
const (
	// waitMargin is how much longer than an execution's timeout a call
	// waits for it (its start, its end being recorded).
	waitMargin = 30 * time.Second
	// maxListed bounds list_executions.
	maxListed = 100
	// maxCommandShown bounds a command as listed.
	maxCommandShown = 4 << 10
)

// Store keeps the sessions' executions, and says what the executors
// offer and how many runs a client has going (store.Sessions, Executors
// and Limits: a *store.Store).
type Store interface {
	ReserveExecution(ctx context.Context, ref runbox.SessionRef, limits runbox.ExecutionLimits) (runbox.Reservation, error)
	Release(ctx context.Context, r runbox.Reservation) error
	RecordExecution(ctx context.Context, r runbox.Reservation, e runbox.Execution) error
	SessionExecution(ctx context.Context, ref runbox.SessionRef, id string) (runbox.Execution, error)
	ExecutionOf(ctx context.Context, id string) (runbox.Execution, error)
	SessionExecutions(ctx context.Context, ref runbox.SessionRef, n int) ([]runbox.Execution, error)
	ActiveRuns(ctx context.Context, client string) (int, error)
	Landlock(ctx context.Context) (bool, error)
}

// Service runs and follows executions.
type Service struct {
	runs     *runs.Service
	convs    *conversations.Service
	store    Store
	sessions *sessions.Service
	limits   Limits
	log      *slog.Logger
}

// New returns a Service; it ends a session's executions and removes its
// folder when the session ends.
func New(rs *runs.Service, cs *conversations.Service, st Store, ss *sessions.Service, limits Limits, log *slog.Logger) *Service {
	s := &Service{runs: rs, convs: cs, store: st, sessions: ss, limits: limits, log: log.With("component", "commands")}
	ss.OnEnd(s.endSession)
	return s
}

// AsyncInput are execute_code_async's arguments, and execute_code's but
// one.
type AsyncInput struct {
	Command          string            `json:"command" jsonschema:"the shell command to run (bash), e.g. python -c 'print(1)' or ls -la /data"`
	TimeoutSeconds   int               `json:"timeout_seconds,omitempty" jsonschema:"wall-clock limit in seconds (default and most: the server's SANDBOX_TIMEOUT, 300)"`
	Interactive      bool              `json:"interactive,omitempty" jsonschema:"keep stdin open for send_stdin"`
	WorkingDirectory string            `json:"working_directory,omitempty" jsonschema:"where it runs: under /data or /tmp, or relative to /data (default /data, the session's folder)"`
	Environment      map[string]string `json:"environment,omitempty" jsonschema:"extra environment variables (not HOME, PATH, proxy or package-index settings)"`
	SandboxConfig    *SandboxConfig    `json:"sandbox_config,omitempty" jsonschema:"narrows what the command may reach and touch"`
	Secrets          []string          `json:"secrets,omitempty" jsonschema:"names of the operator's secrets the command's HTTPS requests to their domains carry (e.g. [\"openai\"]): it finds a placeholder under the name upper-cased (OPENAI), never the value; runbox's proxy adds the value to the requests to the secret's domains, which it may reach"`
	CallbackURL      string            `json:"callback_url,omitempty" jsonschema:"an https URL runbox POSTs the execution's run record to when it ends, signed per Standard Webhooks; its host must be one this client's callbacks may go to"`
}

// ExecuteInput are execute_code's arguments.
type ExecuteInput struct {
	AsyncInput
	// WaitForCompletion defaults to true; a pointer, so that false is
	// told from absent.
	WaitForCompletion *bool `json:"wait_for_completion,omitempty" jsonschema:"wait for the command to end and return its output (default true); false returns at once with the execution_id"`
}

// Started is what an execution that was not waited for answers.
type Started struct {
	ExecutionID string `json:"execution_id"`
	Status      string `json:"status"`
	Message     string `json:"message,omitempty"`
}

// Output is an execution's state and everything it printed so far.
type Output struct {
	ExecutionID string `json:"execution_id"`
	Status      string `json:"status" jsonschema:"running, completed (any exit code), timeout, cancelled or error"`
	// ExitCode is the command's exit status once it exited; null before,
	// and when it ended otherwise (timeout, cancelled, error).
	ExitCode *int    `json:"exit_code"`
	Output   []Event `json:"output"`
}

// Execution statuses.
const (
	StatusRunning   = "running"
	StatusCompleted = "completed"
	StatusTimeout   = "timeout"
	StatusCancelled = "cancelled"
	StatusError     = "error"
)

// statusOf is a run's status as an execution's.
func statusOf(s runbox.Status) string {
	switch s {
	case runbox.StatusSucceeded, runbox.StatusFailed:
		return StatusCompleted
	case runbox.StatusTimedOut:
		return StatusTimeout
	case runbox.StatusCancelled:
		return StatusCancelled
	case runbox.StatusError:
		return StatusError
	}
	return StatusRunning
}

// session is the caller's session, used now; the sessionless scope and
// the sessions of transports this process holds are opened at their
// first use.
func (s *Service) session(ctx context.Context) (sessions.Ref, error) {
	ref, ok := sessions.From(ctx)
	if !ok {
		ref = sessions.Ref{Client: sessions.Client(ctx)}
	}
	if err := s.sessions.Ensure(ctx, ref); err != nil {
		return sessions.Ref{}, err
	}
	return ref, nil
}

// Executed is execute_code's answer: the execution's Output, or Started
// when it was not waited for.
type Executed = mcp.OneOf[Output, Started]

// Execute starts a command; with wait it follows it to its end (or as
// long as its timeout, and then answers as it stands).
func (s *Service) Execute(ctx context.Context, in ExecuteInput) (Executed, error) {
	id, timeout, err := s.start(ctx, in.AsyncInput)
	if err != nil {
		return Executed{}, err
	}
	if in.WaitForCompletion != nil && !*in.WaitForCompletion {
		return Executed{Second: &Started{ExecutionID: id, Status: StatusRunning,
			Message: "Execution started. Use get_execution_output to retrieve results."}}, nil
	}
	out, err := s.output(ctx, id, time.Duration(timeout)*time.Second+waitMargin)
	if err != nil {
		return Executed{}, err
	}
	return Executed{First: &out}, nil
}

// ExecuteAsync starts a command and answers at once.
func (s *Service) ExecuteAsync(ctx context.Context, in AsyncInput) (Started, error) {
	id, _, err := s.start(ctx, in)
	if err != nil {
		return Started{}, err
	}
	return Started{ExecutionID: id, Status: StatusRunning}, nil
}

// start checks a command, takes a place for it in its session and
// submits its run; it returns the execution's id and timeout.
func (s *Service) start(ctx context.Context, in AsyncInput) (string, int, error) {
	spec, err := s.spec(ctx, in)
	if err != nil {
		return "", 0, err
	}
	ref, err := s.session(ctx)
	if err != nil {
		return "", 0, err
	}
	spec.ConversationID = sessions.Conversation(ref)
	if err := s.admit(ctx); err != nil {
		return "", 0, err
	}
	place, err := s.store.ReserveExecution(ctx, ref, runbox.ExecutionLimits{PerSession: s.limits.PerSession, Total: s.limits.Total})
	if tm, ok := errors.AsType[*runbox.ErrTooManyExecutions](err); ok {
		return "", 0, runbox.Errorf(runbox.ETooManyExecutions, "%s (limit %d); wait for one to end or cancel one", tm.Error(), tm.Limit)
	}
	if err != nil {
		return "", 0, err
	}
	run, err := s.runs.Submit(ctx, spec, "")
	if err != nil {
		if rerr := s.store.Release(context.WithoutCancel(ctx), place); rerr != nil {
			s.log.Warn("give an execution's place back", "err", rerr)
		}
		return "", 0, err
	}
	if err := s.store.RecordExecution(context.WithoutCancel(ctx), place, runbox.Execution{
		RunID: run.ID, Command: clip(in.Command, maxCommandShown), TimeoutSeconds: spec.TimeoutSeconds,
	}); err != nil {
		return "", 0, err
	}
	s.log.Debug("execution started", "run", run.ID, "client", ref.Client, "session", ref.ID)
	timeout := spec.TimeoutSeconds
	if timeout == 0 {
		timeout = s.limits.TimeoutSeconds
	}
	return run.ID, timeout, nil
}

// spec checks a command's arguments and returns its run.
func (s *Service) spec(ctx context.Context, in AsyncInput) (runbox.Spec, error) {
	switch {
	case strings.TrimSpace(in.Command) == "":
		return runbox.Spec{}, runbox.Errorf(runbox.EInvalid, "command is empty")
	case len(in.Command) > s.limits.MaxCommandBytes:
		return runbox.Spec{}, runbox.Errorf(runbox.ETooLarge, "command is %d bytes; the limit is %d", len(in.Command), s.limits.MaxCommandBytes)
	case in.TimeoutSeconds < 0 || in.TimeoutSeconds > s.limits.TimeoutSeconds:
		return runbox.Spec{}, runbox.Errorf(runbox.EInvalid, "timeout_seconds must be between 1 and %d", s.limits.TimeoutSeconds)
	}
	dir, err := workingDirectory(in.WorkingDirectory)
	if err != nil {
		return runbox.Spec{}, err
	}
	if err := checkEnv(in.Environment); err != nil {
		return runbox.Spec{}, err
	}
	network, err := in.SandboxConfig.network()
	if err != nil {
		return runbox.Spec{}, err
	}
	fs, err := in.SandboxConfig.filesystem()
	if err != nil {
		return runbox.Spec{}, err
	}
	if fs != nil {
		if err := s.enforceable(ctx, fs); err != nil {
			return runbox.Spec{}, err
		}
	}
	return runbox.Spec{
		Language:       Language,
		Code:           program(in.Command, dir),
		TimeoutSeconds: in.TimeoutSeconds,
		Env:            in.Environment,
		Interactive:    in.Interactive,
		Network:        network,
		Secrets:        in.Secrets,
		Filesystem:     fs,
		Parallel:       true,
		Command:        true,
		CallbackURL:    in.CallbackURL,
	}, nil
}

// enforceable refuses filesystem rules no executor's sandboxes can hold
// to (no Landlock: an old kernel, a runtime such as gVisor).
func (s *Service) enforceable(ctx context.Context, fs *runbox.Filesystem) error {
	ok, err := s.store.Landlock(ctx)
	if err != nil {
		return err
	}
	if !ok {
		return runbox.Errorf(runbox.EUnsupported,
			"%s cannot be enforced by this server's sandboxes (their kernel offers no Landlock); leave it out or ask the operator", describe(fs))
	}
	return nil
}

// admit holds a new execution to its client's tier: its runs in flight.
// (runs.Submit checks the rest of the tier.)
func (s *Service) admit(ctx context.Context) error {
	limit := auth.Tier(ctx).ConcurrentRuns
	if limit == 0 {
		return nil
	}
	n, err := s.store.ActiveRuns(ctx, sessions.Client(ctx))
	if err != nil {
		return err
	}
	if n >= limit {
		return runbox.Errorf(runbox.ETooManyExecutions,
			"this client has %d runs queued or running, its tier's limit (%d); wait for one to end or cancel one", n, limit)
	}
	return nil
}

// execution returns the caller's session's execution id.
func (s *Service) execution(ctx context.Context, id string) (runbox.Execution, error) {
	ref, err := s.session(ctx)
	if err != nil {
		return runbox.Execution{}, err
	}
	e, err := s.store.SessionExecution(ctx, ref, id)
	if errors.Is(err, runbox.ErrRunNotFound) {
		return runbox.Execution{}, runbox.Errorf(runbox.ENotFound, "no execution %s in this session", clip(id, 64))
	}
	return e, err
}

// executionRun returns the caller's session's execution id and its run.
func (s *Service) executionRun(ctx context.Context, id string) (runbox.Execution, runbox.Run, error) {
	e, err := s.execution(ctx, id)
	if err != nil {
		return runbox.Execution{}, runbox.Run{}, err
	}
	run, err := s.runs.Get(ctx, e.RunID)
	return e, run, err
}

// OutputInput are get_execution_output's arguments.
type OutputInput struct {
	ExecutionID string `json:"execution_id" jsonschema:"the execution's id"`
	Wait        bool   `json:"wait,omitempty" jsonschema:"wait for the execution to end (at most its timeout), then answer"`
}

// Output returns an execution's output so far; with wait, once it has
// ended or its time is up.
func (s *Service) Output(ctx context.Context, in OutputInput) (Output, error) {
	e, err := s.execution(ctx, in.ExecutionID)
	if err != nil {
		return Output{}, err
	}
	wait := time.Duration(0)
	if in.Wait {
		wait = time.Duration(max(e.TimeoutSeconds, 1))*time.Second + waitMargin
	}
	return s.output(ctx, e.RunID, wait)
}

// output waits up to wait for run id to end, then answers as it stands.
func (s *Service) output(ctx context.Context, id string, wait time.Duration) (Output, error) {
	if wait > 0 {
		// A caller that asked for progress hears the output as it comes.
		onEvent, stop := mcp.Progress(ctx)
		wctx, cancel := context.WithTimeout(ctx, wait)
		_, err := s.runs.Wait(wctx, id, 0, onEvent)
		cancel()
		stop()
		if err != nil && ctx.Err() != nil {
			return Output{}, ctx.Err()
		}
	}
	run, evs, err := s.runs.Events(ctx, id)
	if err != nil {
		return Output{}, err
	}
	e, err := s.store.ExecutionOf(ctx, id)
	if err != nil {
		return Output{}, err
	}
	return Output{ExecutionID: id, Status: statusOf(run.Status), ExitCode: exitCode(run), Output: convert(evs, e.TimeoutSeconds)}, nil
}

// exitCode is a run's exit status once its program exited.
func exitCode(run runbox.Run) *int {
	if run.Result == nil || (run.Status != runbox.StatusSucceeded && run.Status != runbox.StatusFailed) {
		return nil
	}
	code := run.Result.ExitCode
	return &code
}

// SendInput is send_stdin with execution_id and input_data: the input
// of an interactive execution of the caller's session.
func (s *Service) SendInput(ctx context.Context, id, data string, eof bool) error {
	e, err := s.execution(ctx, id)
	if err != nil {
		return err
	}
	// As the streaming server does: what is sent is a line.
	if data != "" && !strings.HasSuffix(data, "\n") {
		data += "\n"
	}
	return s.runs.SendStdin(ctx, e.RunID, data, eof)
}

// CancelInput are cancel_execution's arguments.
type CancelInput struct {
	ExecutionID string `json:"execution_id" jsonschema:"the execution's id"`
	Force       bool   `json:"force,omitempty" jsonschema:"kill at once (SIGKILL); without it the command gets SIGTERM and 5 s to end before it is killed"`
}

// Cancelled is cancel_execution's answer.
type Cancelled struct {
	Success     bool   `json:"success"`
	WasRunning  bool   `json:"was_running"`
	ExecutionID string `json:"execution_id"`
	Status      string `json:"status"`
}

// Cancel ends an execution: killed with force, else asked to stop and
// killed after a grace. One that ended already is left as it is.
func (s *Service) Cancel(ctx context.Context, in CancelInput) (Cancelled, error) {
	e, run, err := s.executionRun(ctx, in.ExecutionID)
	if err != nil {
		return Cancelled{}, err
	}
	was := !run.Status.Final()
	var st runbox.Status
	if in.Force {
		st, err = s.runs.Cancel(ctx, e.RunID)
	} else {
		st, err = s.runs.Terminate(ctx, e.RunID)
	}
	if err != nil {
		return Cancelled{}, err
	}
	return Cancelled{Success: true, WasRunning: was, ExecutionID: e.RunID, Status: statusOf(st)}, nil
}

// Info is an execution as list_executions and get_execution_status show
// it; times are Unix seconds.
type Info struct {
	ID          string   `json:"id"`
	ExecutionID string   `json:"execution_id"`
	Status      string   `json:"status"`
	Command     string   `json:"command"`
	Interactive bool     `json:"interactive"`
	StartedAt   float64  `json:"started_at"`
	CompletedAt *float64 `json:"completed_at"`
	ExitCode    *int     `json:"exit_code"`
	DurationMS  *int64   `json:"duration_ms"`
	// ErrorMessage says why the service could not run it to its end.
	ErrorMessage *string `json:"error_message"`
}

func info(e runbox.Execution, run runbox.Run) Info {
	started := run.CreatedAt
	if !run.StartedAt.IsZero() {
		started = run.StartedAt
	}
	i := Info{ID: e.RunID, ExecutionID: e.RunID, Status: statusOf(run.Status), Command: e.Command,
		Interactive: run.Interactive, StartedAt: unix(started), ExitCode: exitCode(run)}
	if !run.FinishedAt.IsZero() {
		done := unix(run.FinishedAt)
		ms := run.FinishedAt.Sub(started).Milliseconds()
		i.CompletedAt, i.DurationMS = &done, &ms
	}
	if run.Result != nil && run.Result.Error != "" {
		msg := run.Result.Error
		i.ErrorMessage = &msg
	}
	return i
}

// StatusInput are get_execution_status's arguments.
type StatusInput struct {
	ExecutionID string `json:"execution_id" jsonschema:"the execution's id"`
}

// Status returns an execution's state in detail.
func (s *Service) Status(ctx context.Context, in StatusInput) (Info, error) {
	e, run, err := s.executionRun(ctx, in.ExecutionID)
	if err != nil {
		return Info{}, err
	}
	return info(e, run), nil
}

// List is list_executions' answer.
type List struct {
	Executions []Info `json:"executions"`
}

// List returns the session's executions, oldest first (its last 100).
func (s *Service) List(ctx context.Context, _ struct{}) (List, error) {
	ref, err := s.session(ctx)
	if err != nil {
		return List{}, err
	}
	execs, err := s.store.SessionExecutions(ctx, ref, maxListed)
	if err != nil {
		return List{}, err
	}
	out := List{Executions: make([]Info, 0, len(execs))}
	for _, e := range execs {
		run, err := s.runs.Get(ctx, e.RunID)
		if errors.Is(err, runbox.ErrRunNotFound) {
			continue // its record expired
		}
		if err != nil {
			return List{}, err
		}
		out.Executions = append(out.Executions, info(e, run))
	}
	return out, nil
}

// endSession cancels a session's executions and removes its folder, as
// close_session does for a conversation.
func (s *Service) endSession(ctx context.Context, ref sessions.Ref) error {
	err := s.convs.Close(ctx, sessions.Conversation(ref))
	switch {
	case errors.Is(err, conversations.ErrClosed):
	case err != nil:
		return fmt.Errorf("close the session's folder: %w", err)
	default:
		s.log.Info("an ended session's executions cancelled and its folder removed", "client", ref.Client, "session", ref.ID)
	}
	return nil
}
