// Package mcp is the service's MCP server: the tools, built on the official
// Go SDK, each a thin adapter from tool arguments to the runs service and
// back. Transports (Streamable HTTP, HTTP+SSE, stdio) are wired by the
// caller; the tools are the same on each.
package mcp

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"strings"

	mcpsdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/runbox-dev/runbox"
	"github.com/runbox-dev/runbox/internal/audit"
	"github.com/runbox-dev/runbox/internal/auth"
	"github.com/runbox-dev/runbox/internal/conversations"
	"github.com/runbox-dev/runbox/internal/runs"
	"github.com/runbox-dev/runbox/internal/sessions"
)

// Name and Version identify the server to clients.
const (
	Name    = "runbox"
	Version = "0.1.0"
)

const instructions = `Runs Python, JavaScript, TypeScript, bash, R, SQL (SQLite), Go, Rust, Java, C, C++, Ruby and
PHP code in isolated sandboxes without network access (list_runners says which this server has).
Each conversation (conversationId) has a folder mounted at /data that persists between runs: files
written there are returned with download URLs. Python has pandas, numpy, matplotlib, seaborn, scipy,
openpyxl and reportlab; R has ggplot2, dplyr and readr. Save charts as PNG files in /data. For
compiled languages a failed build is a failed run with phase "compile". Where the operator allows it,
a run may reach named domains over HTTP(S) (network: {allowed_domains}) and install pip or npm
packages (packages); a domain outside the client's allowlist is refused with egress_denied.`

// Server holds what the tools need.
type Server struct {
	runs  *runs.Service
	convs *conversations.Service
	log   *slog.Logger
	sdk   *mcpsdk.Server
	// Audit, when set before use, records every tool call.
	Audit *audit.Recorder
	// stopping ends when the api stops: callers that go then do not
	// cancel their runs.
	stopping context.Context
	// codes rename error codes, by tool, for the tools of families that
	// speak another specification's dialect (AddTool).
	codes map[string]map[string]string
	// Sessions, when set before use, ends the sessions of the transports
	// this process holds when they close.
	Sessions *sessions.Service
	held     held
	// input takes send_stdin's execution_id/input_data (the commands
	// tools'), when a family serves them (SetExecutionInput).
	input ExecutionInput
}

// ExecutionInput sends input to an execution of the caller's session.
type ExecutionInput interface {
	SendInput(ctx context.Context, executionID, data string, eof bool) error
}

// SetExecutionInput has send_stdin take execution_id and input_data too,
// for in.
func (s *Server) SetExecutionInput(in ExecutionInput) { s.input = in }

// New builds the MCP server with every tool.
// stopping ends when the api stops.
func New(stopping context.Context, rs *runs.Service, cs *conversations.Service, log *slog.Logger) *Server {
	s := &Server{runs: rs, convs: cs, log: log.With("component", "mcp"), stopping: stopping, codes: map[string]map[string]string{},
		held: held{refs: map[*mcpsdk.ServerSession]sessions.Ref{}}}
	s.sdk = mcpsdk.NewServer(&mcpsdk.Implementation{Name: Name, Version: Version}, &mcpsdk.ServerOptions{
		Instructions: instructions,
	})
	mcpsdk.AddTool(s.sdk, s.describe(&mcpsdk.Tool{
		Name: "run_code",
		Description: "Run a program and wait for it to finish. Returns stdout, stderr, the exit code and every file " +
			"in /data with a download URL. language is python, javascript, typescript, bash, r, sql, go, rust, java, c, " +
			"cpp, ruby or php (list_runners says which this server offers). For compiled languages a failed build is a " +
			"failed run with phase \"compile\" and the compiler's messages in stderr. Pass the same conversationId " +
			"to keep working with the same files. The program has no network unless network.allowed_domains names " +
			"what it may reach; packages installs pip/npm packages into the conversation first.",
	}), s.runCode)
	mcpsdk.AddTool(s.sdk, s.describe(&mcpsdk.Tool{
		Name:        "list_runners",
		Description: "List the languages that can be run, with their image and version.",
	}), s.listRunners)
	mcpsdk.AddTool(s.sdk, s.describe(&mcpsdk.Tool{
		Name: "start_run",
		Description: "Start a program and return at once with its run_id; follow it with get_run. " +
			"With interactive: true its stdin stays open for send_stdin.",
	}), s.startRun)
	mcpsdk.AddTool(s.sdk, s.describe(&mcpsdk.Tool{
		Name: "get_run",
		Description: "A run's status, its events after after_seq (output as it was produced), and its result once done. " +
			"wait_seconds waits for new events; pass the returned last_seq as after_seq to page on.",
	}), s.getRun)
	mcpsdk.AddTool(s.sdk, s.describe(&mcpsdk.Tool{
		Name:        "cancel_run",
		Description: "Cancel a run: a queued one never starts, a running one is killed. Files written so far are kept.",
	}), s.cancelRun)
	mcpsdk.AddTool(s.sdk, s.describe(&mcpsdk.Tool{
		Name:        "list_runs",
		Description: "Recent runs with their status, newest first: a conversation's, or all.",
	}), s.listRuns)
	mcpsdk.AddTool(s.sdk, s.describe(&mcpsdk.Tool{
		Name:        "send_stdin",
		Description: "Send input to a run started with interactive: true; eof: true closes its stdin.",
	}), s.sendStdin)
	addFileTools(s)
	// Outermost first: a call knows its session, then is recorded before
	// it is counted, so that a refused call is in the log too.
	s.sdk.AddReceivingMiddleware(s.sessionScope, aliases, s.recordCalls, s.countCalls, structuredErrors)
	return s
}

// run submits a run and follows it to its end, streaming its output as
// progress and cancelling it if the caller goes; a tool error comes back
// as a result.
func (s *Server) run(ctx context.Context, req *mcpsdk.CallToolRequest, in runs.Request) (*runbox.Result, *mcpsdk.CallToolResult, error) {
	run, err := s.runs.Submit(ctx, in.Spec(), in.IdempotencyKey)
	if err != nil {
		res, _, err := s.toolError(ctx, err)
		return nil, res, err
	}
	s.log.Debug("run submitted", "run", run.ID, "client", auth.Client(ctx))
	defer s.cancelWhenGone(ctx, run.ID, in.IdempotencyKey != "")()
	onEvent, stopProgress := s.startProgress(ctx, req)
	res, err := s.runs.Wait(ctx, run.ID, 0, onEvent)
	stopProgress()
	if err != nil {
		res, _, err := s.toolError(ctx, err)
		return nil, res, err
	}
	return res, nil, nil
}

// SDK returns the SDK server, for transports.
func (s *Server) SDK() *mcpsdk.Server { return s.sdk }

func (s *Server) runCode(ctx context.Context, req *mcpsdk.CallToolRequest, in runs.Request) (*mcpsdk.CallToolResult, any, error) {
	if in.Background {
		return s.runBackground(ctx, in)
	}
	res, errResult, err := s.run(ctx, req, in)
	if errResult != nil || err != nil {
		return errResult, nil, err
	}
	out := resultContent(res)
	out.Content = append(out.Content, resourceLinks(res.Artifacts)...)
	// New charts come along as images, so that the model can look at them.
	for _, img := range s.convs.Images(ctx, res.ConversationID, res.Artifacts) {
		out.Content = append(out.Content, &mcpsdk.ImageContent{Data: img.Data, MIMEType: img.ContentType})
	}
	return out, res, nil
}

// RunRef names a run.
type RunRef struct {
	RunID string `json:"run_id" jsonschema:"the run's id, from start_run or run_code"`
}

// Started is start_run's result.
type Started struct {
	RunID          string        `json:"run_id"`
	Status         runbox.Status `json:"status"`
	ConversationID string        `json:"conversationId"`
}

func (s *Server) startRun(ctx context.Context, _ *mcpsdk.CallToolRequest, in runs.StartRequest) (*mcpsdk.CallToolResult, any, error) {
	run, err := s.runs.Submit(ctx, in.Spec(), in.IdempotencyKey)
	if err != nil {
		return s.toolError(ctx, err)
	}
	return nil, Started{RunID: run.ID, Status: run.Status, ConversationID: run.ConversationID}, nil
}

// GetRunInput are get_run's arguments.
type GetRunInput struct {
	RunID       string `json:"run_id" jsonschema:"the run's id"`
	WaitSeconds int    `json:"wait_seconds,omitempty" jsonschema:"wait up to this many seconds (at most 60) for new events"`
	AfterSeq    int64  `json:"after_seq,omitempty" jsonschema:"return only events after this seq"`
}

func (s *Server) getRun(ctx context.Context, _ *mcpsdk.CallToolRequest, in GetRunInput) (*mcpsdk.CallToolResult, any, error) {
	p, err := s.runs.Poll(ctx, in.RunID, in.AfterSeq, in.WaitSeconds)
	if err != nil {
		return s.toolError(ctx, err)
	}
	return nil, p, nil
}

// Cancelled is cancel_run's result.
type Cancelled struct {
	RunID  string        `json:"run_id"`
	Status runbox.Status `json:"status"`
}

func (s *Server) cancelRun(ctx context.Context, _ *mcpsdk.CallToolRequest, in RunRef) (*mcpsdk.CallToolResult, any, error) {
	st, err := s.runs.Cancel(ctx, in.RunID)
	if err != nil {
		return s.toolError(ctx, err)
	}
	return nil, Cancelled{RunID: in.RunID, Status: st}, nil
}

// ListRunsInput are list_runs' arguments.
type ListRunsInput struct {
	ConversationID string `json:"conversationId,omitempty" jsonschema:"only this conversation's runs"`
	SessionID      string `json:"session_id,omitempty" jsonschema:"another name for conversationId"`
}

// RunList is list_runs' result.
type RunList struct {
	Runs []runbox.Run `json:"runs"`
}

func (s *Server) listRuns(ctx context.Context, _ *mcpsdk.CallToolRequest, in ListRunsInput) (*mcpsdk.CallToolResult, any, error) {
	list, err := s.runs.List(ctx, cmp.Or(in.ConversationID, in.SessionID))
	if err != nil {
		return s.toolError(ctx, err)
	}
	return nil, RunList{Runs: list}, nil
}

// SendStdinInput are send_stdin's arguments: a run's (run_id, data), or
// an execution's of the commands tools (execution_id, input_data).
type SendStdinInput struct {
	RunID       string `json:"run_id,omitempty" jsonschema:"the run's id (start_run); or give execution_id"`
	Data        string `json:"data,omitempty" jsonschema:"text for the program's stdin (add the newline input() waits for)"`
	ExecutionID string `json:"execution_id,omitempty" jsonschema:"an execution of this session started with interactive: true (execute_code, execute_code_async); or give run_id"`
	InputData   string `json:"input_data,omitempty" jsonschema:"text for the execution's stdin (add the newline a prompt waits for)"`
	EOF         bool   `json:"eof,omitempty" jsonschema:"close the program's stdin after the text"`
}

func (s *Server) sendStdin(ctx context.Context, _ *mcpsdk.CallToolRequest, in SendStdinInput) (*mcpsdk.CallToolResult, any, error) {
	var err error
	switch {
	case in.RunID != "" && in.ExecutionID != "":
		err = runbox.Errorf(runbox.EInvalid, "give run_id or execution_id, not both")
	case in.ExecutionID != "" && s.input != nil:
		err = s.input.SendInput(ctx, in.ExecutionID, cmp.Or(in.InputData, in.Data), in.EOF)
	case in.RunID != "":
		err = s.runs.SendStdin(ctx, in.RunID, cmp.Or(in.Data, in.InputData), in.EOF)
	default:
		err = runbox.Errorf(runbox.EInvalid, "run_id (or execution_id) is required")
	}
	if err != nil {
		return s.toolError(ctx, err)
	}
	if in.ExecutionID != "" {
		ok := true
		return nil, OK{OK: true, Success: &ok}, nil
	}
	return nil, OK{OK: true}, nil
}

// resultContent is a run's result for clients without structured output: a
// text block with the same JSON.
func resultContent(res *runbox.Result) *mcpsdk.CallToolResult {
	b, _ := json.Marshal(res)
	return &mcpsdk.CallToolResult{Content: []mcpsdk.Content{&mcpsdk.TextContent{Text: string(b)}}}
}

// LanguagesOutput is list_runners' result.
type LanguagesOutput struct {
	Languages []runbox.Runner `json:"languages"`
}

func (s *Server) listRunners(ctx context.Context, _ *mcpsdk.CallToolRequest, _ struct{}) (*mcpsdk.CallToolResult, any, error) {
	runners, err := s.runs.Runners(ctx)
	if err != nil {
		return s.toolError(ctx, err)
	}
	if runners == nil {
		runners = []runbox.Runner{}
	}
	return nil, LanguagesOutput{Languages: runners}, nil
}

// ToolError is the body of a failed tool call.
type ToolError struct {
	Error   string `json:"error"`
	Message string `json:"message"`
	// URL downloads a file too large to return inline.
	URL string `json:"url,omitempty"`
	// RetryAfterSeconds tells a limited client when to come back.
	RetryAfterSeconds int `json:"retry_after_seconds,omitempty"`
	// Available lists what there is instead of what was asked for (the
	// templates of a project's template_unavailable).
	Available []string `json:"available,omitempty"`
}

// choices is an error that says what there is instead.
type choices interface {
	error
	Available() []string
}

// toolError turns err into an isError result. Unexpected errors are logged
// and reported without detail.
func (s *Server) toolError(ctx context.Context, err error) (*mcpsdk.CallToolResult, any, error) {
	code := runbox.ErrorCode(err)
	if code == runbox.EInternal {
		if errors.Is(err, context.Canceled) || ctx.Err() != nil {
			return nil, nil, err // the client went away; nobody reads this
		}
		s.log.Error("tool failed", "err", err)
	}
	body := ToolError{Error: code, Message: runbox.ErrorMessage(err), RetryAfterSeconds: runbox.RetryAfterSeconds(err)}
	if tl, ok := errors.AsType[*conversations.TooLargeError](err); ok {
		body.URL = tl.URL
	}
	if c, ok := errors.AsType[choices](err); ok {
		body.Available = c.Available()
	}
	return errorResult(body), nil, nil
}

// structuredErrors gives the tool errors the SDK makes itself (arguments
// that do not match a tool's schema) the shape of every other: a JSON
// {error, message} as the text and the structured content, which
// clients that parse content[0].text rely on.
func structuredErrors(next mcpsdk.MethodHandler) mcpsdk.MethodHandler {
	return func(ctx context.Context, method string, req mcpsdk.Request) (mcpsdk.Result, error) {
		res, err := next(ctx, method, req)
		if tr, ok := res.(*mcpsdk.CallToolResult); ok && err == nil && tr.IsError && tr.StructuredContent == nil {
			var parts []string
			for _, c := range tr.Content {
				if t, ok := c.(*mcpsdk.TextContent); ok {
					parts = append(parts, t.Text)
				}
			}
			return errorResult(ToolError{Error: runbox.EInvalid, Message: strings.Join(parts, "; ")}), nil
		}
		return res, err
	}
}

// errorResult is a tool error with body as its text and structured
// content.
func errorResult(body any) *mcpsdk.CallToolResult {
	b, _ := json.Marshal(body)
	return &mcpsdk.CallToolResult{
		IsError:           true,
		Content:           []mcpsdk.Content{&mcpsdk.TextContent{Text: string(b)}},
		StructuredContent: body,
	}
}
