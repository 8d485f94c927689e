package projects

import (
	"context"
	"encoding/json"
	"time"

	mcpsdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/runbox-dev/runbox"
	"github.com/runbox-dev/runbox/internal/mcp"
)

// gatewayCodes are runbox's codes as the gateway names them, in the
// project tools' errors (the middleware's included).
var gatewayCodes = map[string]string{
	runbox.ERateLimited:   runbox.ERateLimitExceeded,
	runbox.EQuotaExceeded: runbox.EGatewayQuota,
	runbox.ETooLarge:      runbox.EFileSizeExceeded,
	runbox.EInvalidPath:   runbox.EPathTraversal,
	runbox.ENotFound:      runbox.ESandboxNotFound,
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
	}, mcp.ToolSpec{Out: mcp.SchemaOf[Created](), Codes: gatewayCodes}, svc.Create)
	mcp.AddTool(s, &mcpsdk.Tool{
		Name:        "write_files_to_sandbox",
		Description: "Write files into a project sandbox (at most 10, 500 KB each); its dev server rebuilds and the preview reloads.",
	}, mcp.ToolSpec{Out: mcp.SchemaOf[Written](), Destructive: true, Codes: gatewayCodes}, svc.Write)
	mcp.AddTool(s, &mcpsdk.Tool{
		Name: "get_sandbox_output",
		Description: "Read a project sandbox's console_log (its dev server's log), build_output (the bundler's messages, " +
			"build errors) or preview_url: at most the last 50 KB, with secrets redacted.",
	}, mcp.ToolSpec{Out: mcp.SchemaOf[Output](), ReadOnly: true, Idempotent: true, Codes: gatewayCodes}, svc.Output)

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
