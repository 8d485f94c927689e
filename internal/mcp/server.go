// Package mcp is the service's MCP server: the tools, built on the official
// Go SDK, each a thin adapter from tool arguments to a service and back.
// Transports (Streamable HTTP, HTTP+SSE, stdio) are wired by the caller;
// the tools are the same on each.
//
// # Adding a tool
//
// Every tool is added one way, AddTool: the tools of this package (the
// run tools, the file tools, the Python sandbox PRD's) as much as those of
// the families in packages of their own (internal/commands, preview,
// projects, gitexport), whose Register adds them. A tool is a handler
// func(ctx, In) (Out, error) and a ToolSpec: its input schema comes from
// In, its output schema from Out (Answer adds content shown besides the
// structured answer; OneOf admits either of two answers), its annotations
// and the dialect of its errors (runbox's, the security gateway's, the
// PRD's) from the spec, and so do the aliases it answers to. Every tool is
// then served, audited and counted against the caller's tier alike, by
// the middleware New installs.
//
// send_stdin speaks two specifications: runbox's (run_id, data) and the
// streaming sandbox server's (execution_id, input_data), whose executions
// belong to internal/commands. It takes the latter through Executions, a
// one-method interface given to New: the commands service is built
// first, and the dependency is there from the start, not set later.
package mcp

import (
	"context"
	"log/slog"

	mcpsdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/runbox-dev/runbox/internal/audit"
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

// Options are what the server's tools and middleware stand on.
type Options struct {
	Runs          *runs.Service
	Conversations *conversations.Service
	// Executions, when set, are the commands tools' (internal/commands):
	// send_stdin takes their execution_id and input_data too.
	Executions Executions
	// Sessions, when set, ends the sessions of the transports this
	// process holds when they close.
	Sessions *sessions.Service
	// Audit, when set, records every tool call.
	Audit *audit.Recorder
	Log   *slog.Logger
}

// Executions sends input to an execution of the caller's session.
type Executions interface {
	SendInput(ctx context.Context, executionID, data string, eof bool) error
}

// Server holds what the tools need.
type Server struct {
	runs       *runs.Service
	convs      *conversations.Service
	executions Executions
	sessions   *sessions.Service
	audit      *audit.Recorder
	log        *slog.Logger
	sdk        *mcpsdk.Server
	// stopping ends when the api stops: callers that go then do not
	// cancel their runs.
	stopping context.Context
	tools    registry
	held     held
}

// New builds the MCP server with the tools of this package; the families
// add theirs with their Register. stopping ends when the api stops.
func New(stopping context.Context, o Options) *Server {
	s := &Server{runs: o.Runs, convs: o.Conversations, executions: o.Executions, sessions: o.Sessions, audit: o.Audit,
		log: o.Log.With("component", "mcp"), stopping: stopping, held: held{refs: map[*mcpsdk.ServerSession]sessions.Ref{}}}
	s.sdk = mcpsdk.NewServer(&mcpsdk.Implementation{Name: Name, Version: Version}, &mcpsdk.ServerOptions{
		Instructions: instructions,
	})
	s.addRunTools()
	s.addFileTools()
	s.addStateTools()
	s.addPRDTools()
	s.addBatchTools()
	// Outermost first: a call knows its session and its tool's name, then
	// is recorded before it is counted, so that a refused call is in the
	// log too.
	s.sdk.AddReceivingMiddleware(s.sessionScope, s.aliases, s.recordCalls, s.countCalls, structuredErrors)
	return s
}

// SDK returns the SDK server, for transports.
func (s *Server) SDK() *mcpsdk.Server { return s.sdk }
