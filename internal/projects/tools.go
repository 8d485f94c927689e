package projects

import (
	"context"
	"encoding/json"
	"time"

	mcpsdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/runbox-dev/runbox"
	"github.com/runbox-dev/runbox/internal/mcp"
)

// Register adds the gateway's project tools and its health resource to
// the MCP server. checks are the service's dependencies, by name.
func Register(s *mcp.Server, svc *Service, checks map[string]func(context.Context) error) {
	// Errors in the gateway's dialect, whose not_found is a sandbox's;
	// annotations as the gateway gives them: get_sandbox_output reads and
	// may be repeated; the others change the project.
	gateway := mcp.Gateway(map[string]string{runbox.ENotFound: runbox.ESandboxNotFound})
	mcp.AddTool(s, &mcpsdk.Tool{
		Name: "create_sandbox_for_project",
		Description: "Create a project sandbox from a template (react, next, vue or node, as installed) with initial files; " +
			"its dev server starts and the result's preview_url shows the app in a browser. The project lives for an hour.",
	}, mcp.ToolSpec{Dialect: gateway}, svc.Create)
	mcp.AddTool(s, &mcpsdk.Tool{
		Name:        "write_files_to_sandbox",
		Description: "Write files into a project sandbox (at most 10, 500 KB each); its dev server rebuilds and the preview reloads.",
	}, mcp.ToolSpec{Destructive: true, Dialect: gateway}, svc.Write)
	mcp.AddTool(s, &mcpsdk.Tool{
		Name: "get_sandbox_output",
		Description: "Read a project sandbox's console_log (its dev server's log), build_output (the bundler's messages, " +
			"build errors) or preview_url: at most the last 50 KB, with secrets redacted.",
	}, mcp.ToolSpec{ReadOnly: true, Idempotent: true, Dialect: gateway}, svc.Output)

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
