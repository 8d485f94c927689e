package mcp

import (
	"context"

	"github.com/google/jsonschema-go/jsonschema"
	mcpsdk "github.com/modelcontextprotocol/go-sdk/mcp"
)

// Tool families of their own packages (previews, projects) register on the
// server through these, so that every tool is described alike: an output
// schema that admits the tool error too, annotations, the audit log and
// the caller's tier, whichever package it comes from.

// ToolInfo is what a tool declares beyond its input.
type ToolInfo struct {
	// Out is the schema of the tool's result (SchemaOf).
	Out                               *jsonschema.Schema
	ReadOnly, Destructive, Idempotent bool
}

// SchemaOf returns the JSON schema of T.
func SchemaOf[T any]() *jsonschema.Schema { return schemaOf[T]() }

// AddTool registers a tool on s, with its output schema and annotations.
func AddTool[In any](s *Server, t *mcpsdk.Tool, info ToolInfo, h mcpsdk.ToolHandlerFor[In, any]) {
	mcpsdk.AddTool(s.sdk, declare(t, toolInfo{out: info.Out, readOnly: info.ReadOnly,
		destructive: info.Destructive, idempotent: info.Idempotent}), h)
}

// ToolError turns err into the isError result a tool returns: its code
// and message, or "internal" (logged) for an unexpected error.
func (s *Server) ToolError(ctx context.Context, err error) (*mcpsdk.CallToolResult, any, error) {
	return s.toolError(ctx, err)
}

// ErrorResult is a tool error with body as its text and structured
// content, for a family whose errors carry more than code and message.
func ErrorResult(body any) *mcpsdk.CallToolResult { return errorResult(body) }
