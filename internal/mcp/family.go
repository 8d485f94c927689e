package mcp

import (
	"context"

	"github.com/google/jsonschema-go/jsonschema"
	mcpsdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/runbox-dev/runbox"
)

// A tool family of its own (the git tools of internal/gitexport) lives in
// its package and adds its tools here, so that they are served, audited
// and counted against the caller's tier like every other tool.

// ToolSpec is what a tool of a family declares beyond its input.
type ToolSpec struct {
	// Out is the schema of its answer (SchemaOf); a tool error is
	// admitted besides.
	Out                               *jsonschema.Schema
	ReadOnly, Destructive, Idempotent bool
	// OpenWorld says the tool reaches outside the service.
	OpenWorld bool
	// Egress says the tool's programs may ask to reach outside the
	// service: it is open-world where the operator lets clients ask.
	Egress bool
	// Codes renames runbox's error codes in this tool's errors, those of
	// the middleware included (rate_limited …), for clients written to
	// another specification. A code it does not name is kept.
	Codes map[string]string
}

// SchemaOf is the JSON schema of T, for ToolSpec.Out.
func SchemaOf[T any]() *jsonschema.Schema { return schemaOf[T]() }

// AddTool adds a family's tool to s. h is the tool: the arguments in, its
// answer or an error out; an *runbox.Error becomes a tool error with its
// code (renamed by spec.Codes) and message, anything else "internal" and
// is logged.
func AddTool[In, Out any](s *Server, t *mcpsdk.Tool, spec ToolSpec, h func(context.Context, In) (Out, error)) {
	if _, dup := s.codes[t.Name]; dup || tools[t.Name].out != nil {
		panic("mcp: tool " + t.Name + " is added twice")
	}
	s.codes[t.Name] = spec.Codes
	info := toolInfo{out: spec.Out, readOnly: spec.ReadOnly, destructive: spec.Destructive,
		idempotent: spec.Idempotent, openWorld: spec.OpenWorld, egress: spec.Egress}
	name := t.Name
	mcpsdk.AddTool(s.sdk, s.describeWith(t, info), func(ctx context.Context, req *mcpsdk.CallToolRequest, in In) (*mcpsdk.CallToolResult, any, error) {
		out, err := h(context.WithValue(ctx, progressKey{}, progressOf{s, req}), in)
		if err != nil {
			return s.toolErrorOf(ctx, name, err)
		}
		return nil, out, nil
	})
}

type progressKey struct{}

// progressOf is a family tool's call, for Progress.
type progressOf struct {
	s   *Server
	req *mcpsdk.CallToolRequest
}

// Progress returns, for a family tool's call that carries a progress
// token, a handler that streams a run's output to the caller as progress
// notifications (and a heartbeat while it is silent, as run_code's), and
// the func that ends them; nil and a no-op otherwise.
func Progress(ctx context.Context) (func(runbox.Event), func()) {
	p, ok := ctx.Value(progressKey{}).(progressOf)
	if !ok {
		return nil, func() {}
	}
	return p.s.startProgress(ctx, p.req)
}

// toolErrorOf is toolError in the dialect of the tool name.
func (s *Server) toolErrorOf(ctx context.Context, name string, err error) (*mcpsdk.CallToolResult, any, error) {
	res, out, err := s.toolError(ctx, err)
	if codes := s.codes[name]; res != nil && codes != nil {
		if body, ok := res.StructuredContent.(ToolError); ok {
			if renamed, ok := codes[body.Error]; ok {
				body.Error = renamed
				res = errorResult(body)
			}
		}
	}
	return res, out, err
}
