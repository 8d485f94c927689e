package projects

import (
	"context"
	"encoding/json"
	"errors"
	"time"

	"github.com/google/jsonschema-go/jsonschema"
	mcpsdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/runbox-dev/runbox"
	"github.com/runbox-dev/runbox/internal/mcp"
)

// ToolError is the body of a project tool's error: the gateway's code
// (PATH_TRAVERSAL, FILE_SIZE_EXCEEDED, QUOTA_EXCEEDED, SANDBOX_NOT_FOUND,
// RATE_LIMIT_EXCEEDED, …, or template_unavailable with what is).
type ToolError struct {
	Error             string   `json:"error"`
	Message           string   `json:"message"`
	Available         []string `json:"available,omitempty"`
	RetryAfterSeconds int      `json:"retry_after_seconds,omitempty"`
}

// gatewayCodes are runbox's codes as the gateway names them.
var gatewayCodes = map[string]string{
	runbox.ERateLimited:   runbox.EGatewayRateLimit,
	runbox.EQuotaExceeded: runbox.EGatewayQuota,
	runbox.ETooLarge:      runbox.EGatewayFileSize,
	runbox.EInvalidPath:   runbox.EGatewayPathTraversal,
	runbox.ENotFound:      runbox.EGatewaySandboxNotFound,
}

// toolError answers err in the gateway's terms.
func toolError(ctx context.Context, s *mcp.Server, err error) (*mcpsdk.CallToolResult, any, error) {
	if u, ok := errors.AsType[*UnavailableError](err); ok {
		return mcp.ErrorResult(ToolError{Error: runbox.ETemplateUnavailable, Message: u.Error(), Available: u.Available}), nil, nil
	}
	if e, ok := errors.AsType[*runbox.Error](err); ok {
		if code, ok := gatewayCodes[e.Code]; ok {
			return mcp.ErrorResult(ToolError{Error: code, Message: e.Message, RetryAfterSeconds: runbox.RetryAfterSeconds(err)}), nil, nil
		}
	}
	return s.ToolError(ctx, err)
}

// outputOf is a tool's result schema, or its error's.
func outputOf[T any]() *jsonschema.Schema {
	return &jsonschema.Schema{AnyOf: []*jsonschema.Schema{mcp.SchemaOf[T](), mcp.SchemaOf[ToolError]()}}
}

// handler adapts a service method to a tool.
func handler[In, Out any](s *mcp.Server, f func(context.Context, In) (Out, error)) mcpsdk.ToolHandlerFor[In, any] {
	return func(ctx context.Context, _ *mcpsdk.CallToolRequest, in In) (*mcpsdk.CallToolResult, any, error) {
		out, err := f(ctx, in)
		if err != nil {
			return toolError(ctx, s, err)
		}
		return nil, out, nil
	}
}

// Register adds the gateway's project tools and its health resource to
// the MCP server. checks are the service's dependencies, by name.
func Register(s *mcp.Server, svc *Service, checks map[string]func(context.Context) error) {
	// Annotations as the gateway gives them: get_sandbox_output reads and
	// may be repeated; the others change the project.
	mcp.AddTool(s, &mcpsdk.Tool{
		Name: "create_sandbox_for_project",
		Description: "Create a project sandbox from a template (react, next, vue or node, as installed) with initial files; " +
			"its dev server starts and the result's preview_url shows the app in a browser. The project lives for an hour.",
	}, mcp.ToolInfo{Out: outputOf[Created]()}, handler(s, svc.Create))
	mcp.AddTool(s, &mcpsdk.Tool{
		Name:        "write_files_to_sandbox",
		Description: "Write files into a project sandbox (at most 10, 500 KB each); its dev server rebuilds and the preview reloads.",
	}, mcp.ToolInfo{Out: outputOf[Written](), Destructive: true}, handler(s, svc.Write))
	mcp.AddTool(s, &mcpsdk.Tool{
		Name: "get_sandbox_output",
		Description: "Read a project sandbox's console_log (its dev server's log), build_output (the bundler's messages, " +
			"build errors) or preview_url: at most the last 50 KB, with secrets redacted.",
	}, mcp.ToolInfo{Out: outputOf[Output](), ReadOnly: true, Idempotent: true}, handler(s, svc.Output))

	started := time.Now()
	s.SDK().AddResource(&mcpsdk.Resource{
		URI: "health://check", Name: "health", MIMEType: "application/json",
		Description: "The service's health: status, uptime, timestamp and its dependencies' state.",
	}, func(ctx context.Context, req *mcpsdk.ReadResourceRequest) (*mcpsdk.ReadResourceResult, error) {
		b, err := json.Marshal(health(ctx, started, checks))
		if err != nil {
			return nil, err
		}
		return &mcpsdk.ReadResourceResult{Contents: []*mcpsdk.ResourceContents{{
			URI: req.Params.URI, MIMEType: "application/json", Text: string(b),
		}}}, nil
	})
}

// Health is health://check's content.
type Health struct {
	Status       string            `json:"status"` // healthy or unhealthy
	Uptime       float64           `json:"uptime"` // seconds
	Timestamp    time.Time         `json:"timestamp"`
	Dependencies map[string]string `json:"dependencies"` // ok or unavailable
}

func health(ctx context.Context, started time.Time, checks map[string]func(context.Context) error) Health {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	h := Health{Status: "healthy", Uptime: time.Since(started).Seconds(), Timestamp: time.Now().UTC(), Dependencies: map[string]string{}}
	for name, check := range checks {
		if err := check(ctx); err != nil {
			h.Dependencies[name] = "unavailable"
			h.Status = "unhealthy"
		} else {
			h.Dependencies[name] = "ok"
		}
	}
	return h
}
