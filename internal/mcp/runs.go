package mcp

import (
	"cmp"
	"context"
	"encoding/json"

	mcpsdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/runbox-dev/runbox"
	"github.com/runbox-dev/runbox/internal/auth"
	"github.com/runbox-dev/runbox/internal/runs"
)

// addRunTools adds the tools that run programs and follow them.
func (s *Server) addRunTools() {
	AddTool(s, &mcpsdk.Tool{
		Name: "run_code",
		Description: "Run a program and wait for it to finish. Returns stdout, stderr, the exit code and every file " +
			"in /data with a download URL. language is python, javascript, typescript, bash, r, sql, go, rust, java, c, " +
			"cpp, ruby or php (list_runners says which this server offers). For compiled languages a failed build is a " +
			"failed run with phase \"compile\" and the compiler's messages in stderr. Pass the same conversationId " +
			"to keep working with the same files. The program has no network unless network.allowed_domains names " +
			"what it may reach; packages installs pip/npm packages into the conversation first.",
	}, ToolSpec{Destructive: true, Egress: true, Aliases: []string{"sandbox.run_code"}}, s.runCode)
	AddTool(s, &mcpsdk.Tool{
		Name:        "list_runners",
		Description: "List the languages that can be run, with their image and version.",
	}, ToolSpec{ReadOnly: true, Idempotent: true, Aliases: []string{"sandbox.list_runners"}}, s.listRunners)
	AddTool(s, &mcpsdk.Tool{
		Name: "start_run",
		Description: "Start a program and return at once with its run_id; follow it with get_run. " +
			"With interactive: true its stdin stays open for send_stdin.",
	}, ToolSpec{Destructive: true, Egress: true}, s.startRun)
	AddTool(s, &mcpsdk.Tool{
		Name: "get_run",
		Description: "A run's status, its events after after_seq (output as it was produced), and its result once done. " +
			"wait_seconds waits for new events; pass the returned last_seq as after_seq to page on.",
	}, ToolSpec{ReadOnly: true, Idempotent: true}, s.getRun)
	AddTool(s, &mcpsdk.Tool{
		Name:        "cancel_run",
		Description: "Cancel a run: a queued one never starts, a running one is killed. Files written so far are kept.",
	}, ToolSpec{Destructive: true, Idempotent: true}, s.cancelRun)
	AddTool(s, &mcpsdk.Tool{
		Name:        "list_runs",
		Description: "Recent runs with their status, newest first: a conversation's, or all.",
	}, ToolSpec{ReadOnly: true, Idempotent: true}, s.listRuns)
	AddTool(s, &mcpsdk.Tool{
		Name:        "send_stdin",
		Description: "Send input to a run started with interactive: true; eof: true closes its stdin.",
	}, ToolSpec{}, s.sendStdin)
}

// run submits a run and follows it to its end, streaming its output as
// progress and cancelling it if the caller goes.
func (s *Server) run(ctx context.Context, in runs.Request) (*runbox.Result, error) {
	run, err := s.runs.Submit(ctx, in.Spec(), in.IdempotencyKey)
	if err != nil {
		return nil, err
	}
	s.log.Debug("run submitted", "run", run.ID, "client", auth.Client(ctx))
	defer s.cancelWhenGone(ctx, run.ID, in.IdempotencyKey != "")()
	onEvent, stopProgress := Progress(ctx)
	res, err := s.runs.Follow(ctx, run, onEvent)
	stopProgress()
	return res, err
}

// runAnswer is run_code's answer: the result, as JSON text too, with
// links to its files and the new charts as images, so that the model can
// look at them.
type runAnswer = Answer[runbox.Result]

func (s *Server) runCode(ctx context.Context, in runs.Request) (runAnswer, error) {
	if in.Background {
		return s.runBackground(ctx, in)
	}
	res, err := s.run(ctx, in)
	if err != nil {
		return runAnswer{}, err
	}
	content := append(resultContent(res), resourceLinks(res.Artifacts)...)
	for _, img := range s.convs.Images(ctx, res.ConversationID, res.Artifacts) {
		content = append(content, &mcpsdk.ImageContent{Data: img.Data, MIMEType: img.ContentType})
	}
	return runAnswer{Value: *res, Content: content}, nil
}

// resultContent is a run's result for clients without structured output: a
// text block with the same JSON.
func resultContent(res *runbox.Result) []mcpsdk.Content {
	b, _ := json.Marshal(res)
	return []mcpsdk.Content{&mcpsdk.TextContent{Text: string(b)}}
}

// resourceLinks returns the artifacts of a run as resource_link items.
func resourceLinks(files []runbox.FileInfo) []mcpsdk.Content {
	out := make([]mcpsdk.Content, 0, len(files))
	for _, f := range files {
		size := f.SizeBytes
		out = append(out, &mcpsdk.ResourceLink{URI: f.URL, Name: f.Name, Title: f.Path, MIMEType: f.MimeType, Size: &size})
	}
	return out
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

func (s *Server) startRun(ctx context.Context, in runs.StartRequest) (Started, error) {
	run, err := s.runs.Submit(ctx, in.Spec(), in.IdempotencyKey)
	if err != nil {
		return Started{}, err
	}
	return Started{RunID: run.ID, Status: run.Status, ConversationID: run.ConversationID}, nil
}

// GetRunInput are get_run's arguments.
type GetRunInput struct {
	RunID       string `json:"run_id" jsonschema:"the run's id"`
	WaitSeconds int    `json:"wait_seconds,omitempty" jsonschema:"wait up to this many seconds (at most 60) for new events"`
	AfterSeq    int64  `json:"after_seq,omitempty" jsonschema:"return only events after this seq"`
}

func (s *Server) getRun(ctx context.Context, in GetRunInput) (runs.Progress, error) {
	return s.runs.Poll(ctx, in.RunID, in.AfterSeq, in.WaitSeconds)
}

// Cancelled is cancel_run's result.
type Cancelled struct {
	RunID  string        `json:"run_id"`
	Status runbox.Status `json:"status"`
}

func (s *Server) cancelRun(ctx context.Context, in RunRef) (Cancelled, error) {
	st, err := s.runs.Cancel(ctx, in.RunID)
	if err != nil {
		return Cancelled{}, err
	}
	return Cancelled{RunID: in.RunID, Status: st}, nil
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

func (s *Server) listRuns(ctx context.Context, in ListRunsInput) (RunList, error) {
	list, err := s.runs.List(ctx, cmp.Or(in.ConversationID, in.SessionID))
	if err != nil {
		return RunList{}, err
	}
	return RunList{Runs: list}, nil
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

// OK is send_stdin's answer; an execution's input (the streaming
// sandbox server's) answers success too, as that server does.
type OK struct {
	OK      bool  `json:"ok"`
	Success *bool `json:"success,omitempty"`
}

func (s *Server) sendStdin(ctx context.Context, in SendStdinInput) (OK, error) {
	var err error
	switch {
	case in.RunID != "" && in.ExecutionID != "":
		err = runbox.Errorf(runbox.EInvalid, "give run_id or execution_id, not both")
	case in.ExecutionID != "" && s.executions != nil:
		err = s.executions.SendInput(ctx, in.ExecutionID, cmp.Or(in.InputData, in.Data), in.EOF)
	case in.RunID != "":
		err = s.runs.SendStdin(ctx, in.RunID, cmp.Or(in.Data, in.InputData), in.EOF)
	default:
		err = runbox.Errorf(runbox.EInvalid, "run_id (or execution_id) is required")
	}
	if err != nil {
		return OK{}, err
	}
	if in.ExecutionID != "" {
		ok := true
		return OK{OK: true, Success: &ok}, nil
	}
	return OK{OK: true}, nil
}

// LanguagesOutput is list_runners' result.
type LanguagesOutput struct {
	Languages []runbox.Runner `json:"languages"`
}

func (s *Server) listRunners(ctx context.Context, _ struct{}) (LanguagesOutput, error) {
	runners, err := s.runs.Runners(ctx)
	if err != nil {
		return LanguagesOutput{}, err
	}
	if runners == nil {
		runners = []runbox.Runner{}
	}
	return LanguagesOutput{Languages: runners}, nil
}
