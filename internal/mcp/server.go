// Package mcp is the service's MCP server: the tools, built on the official
// Go SDK, each a thin adapter from tool arguments to the runs service and
// back. Transports (Streamable HTTP, HTTP+SSE, stdio) are wired by the
// caller; the tools are the same on each.
package mcp

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"

	mcpsdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/runbox-dev/runbox"
	"github.com/runbox-dev/runbox/internal/auth"
	"github.com/runbox-dev/runbox/internal/runs"
)

// Name and Version identify the server to clients.
const (
	Name    = "runbox"
	Version = "0.1.0"
)

const instructions = `Runs Python, TypeScript and bash code in isolated sandboxes without network access.
Each conversation (conversationId) has a folder mounted at /data that persists between runs: files
written there are returned with download URLs. Python has pandas, numpy, matplotlib, seaborn, scipy,
openpyxl and reportlab. Save charts as PNG files in /data.`

// Server holds what the tools need.
type Server struct {
	runs *runs.Service
	log  *slog.Logger
	sdk  *mcpsdk.Server
}

// New builds the MCP server with every tool.
func New(rs *runs.Service, log *slog.Logger) *Server {
	s := &Server{runs: rs, log: log.With("component", "mcp")}
	s.sdk = mcpsdk.NewServer(&mcpsdk.Implementation{Name: Name, Version: Version}, &mcpsdk.ServerOptions{
		Instructions: instructions,
	})
	mcpsdk.AddTool(s.sdk, &mcpsdk.Tool{
		Name: "run_code",
		Description: "Run a program and wait for it to finish. Returns stdout, stderr, the exit code and every file " +
			"in /data with a download URL. language is python, typescript or bash. Pass the same conversationId " +
			"to keep working with the same files.",
	}, s.runCode)
	mcpsdk.AddTool(s.sdk, &mcpsdk.Tool{
		Name:        "list_runners",
		Description: "List the languages that can be run, with their image and version.",
	}, s.listRunners)
	s.sdk.AddReceivingMiddleware(aliases)
	return s
}

// SDK returns the SDK server, for transports.
func (s *Server) SDK() *mcpsdk.Server { return s.sdk }

func (s *Server) runCode(ctx context.Context, req *mcpsdk.CallToolRequest, in runs.Request) (*mcpsdk.CallToolResult, any, error) {
	run, err := s.runs.Submit(ctx, in.Spec())
	if err != nil {
		return s.toolError(ctx, err)
	}
	s.log.Debug("run submitted", "run", run.ID, "client", auth.Client(ctx))
	res, err := s.runs.Wait(ctx, run.ID, 0, s.progress(ctx, req))
	if err != nil {
		return s.toolError(ctx, err)
	}
	return resultContent(res), res, nil
}

// progress returns an event handler that streams a run's output to the
// client as progress notifications, when the client asked for progress.
func (s *Server) progress(ctx context.Context, req *mcpsdk.CallToolRequest) func(runbox.Event) {
	token := req.Params.GetProgressToken()
	if token == nil || req.Session == nil {
		return nil
	}
	return func(ev runbox.Event) {
		if ev.Type != runbox.EventStdout && ev.Type != runbox.EventStderr {
			return
		}
		err := req.Session.NotifyProgress(ctx, &mcpsdk.ProgressNotificationParams{
			ProgressToken: token,
			Progress:      float64(ev.Seq),
			Message:       ev.Data,
		})
		if err != nil {
			s.log.Debug("progress notification", "err", err)
		}
	}
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
	body := ToolError{Error: code, Message: runbox.ErrorMessage(err)}
	b, _ := json.Marshal(body)
	return &mcpsdk.CallToolResult{
		IsError:           true,
		Content:           []mcpsdk.Content{&mcpsdk.TextContent{Text: string(b)}},
		StructuredContent: body,
	}, nil, nil
}
