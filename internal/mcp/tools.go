package mcp

import (
	"fmt"

	"github.com/google/jsonschema-go/jsonschema"
	mcpsdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/runbox-dev/runbox"
	"github.com/runbox-dev/runbox/internal/runs"
)

// Every tool declares what it returns (an outputSchema derived from its Go
// type) and how it behaves (annotations). A tool error is an answer too:
// each schema admits the ToolError shape besides the tool's own, so that
// a client that checks results against the schema accepts both.

// OK is send_stdin's answer; an execution's input (the streaming
// sandbox server's) answers success too, as that server does.
type OK struct {
	OK      bool  `json:"ok"`
	Success *bool `json:"success,omitempty"`
}

// toolInfo is what a tool declares beyond its input.
type toolInfo struct {
	out         *jsonschema.Schema
	readOnly    bool
	destructive bool
	idempotent  bool
	// openWorld: the tool reaches outside the service (a git forge).
	openWorld bool
	// egress: its programs may ask to reach outside the service.
	egress bool
}

func schemaOf[T any]() *jsonschema.Schema {
	s, err := jsonschema.For[T](nil)
	if err != nil {
		panic(fmt.Sprintf("output schema of %T: %v", *new(T), err))
	}
	return s
}

var tools = map[string]toolInfo{
	"run_code":       {out: schemaOf[runbox.Result](), destructive: true, egress: true},
	"start_run":      {out: schemaOf[Started](), destructive: true, egress: true},
	"get_run":        {out: schemaOf[runs.Progress](), readOnly: true, idempotent: true},
	"cancel_run":     {out: schemaOf[Cancelled](), destructive: true, idempotent: true},
	"list_runs":      {out: schemaOf[RunList](), readOnly: true, idempotent: true},
	"send_stdin":     {out: schemaOf[OK]()},
	"list_runners":   {out: schemaOf[LanguagesOutput](), readOnly: true, idempotent: true},
	"upload_file":    {out: schemaOf[Uploaded](), destructive: true},
	"run_python":     {out: schemaOf[RunPythonOutput](), destructive: true},
	"read_artifact":  {out: schemaOf[ReadArtifactOutput](), readOnly: true, idempotent: true},
	"list_artifacts": {out: schemaOf[ArtifactList](), readOnly: true, idempotent: true},
	"list_files":     {out: schemaOf[FileList](), readOnly: true, idempotent: true},
	"read_file":      {out: schemaOf[runbox.FileInfo](), readOnly: true, idempotent: true},
	"close_session":  {out: schemaOf[Closed](), destructive: true, idempotent: true},
}

// Tool errors come in runbox's shape, or the PRD's for its tools.
var toolErrorSchema = &jsonschema.Schema{AnyOf: []*jsonschema.Schema{schemaOf[ToolError](), schemaOf[PRDError]()}}

// describe adds the output schema and annotations of its tool to t.
func (s *Server) describe(t *mcpsdk.Tool) *mcpsdk.Tool {
	info, ok := tools[t.Name]
	if !ok {
		panic("mcp: tool " + t.Name + " is not described")
	}
	return s.describeWith(t, info)
}

func (s *Server) describeWith(t *mcpsdk.Tool, info toolInfo) *mcpsdk.Tool {
	t.OutputSchema = &jsonschema.Schema{Type: "object", AnyOf: []*jsonschema.Schema{info.out, toolErrorSchema}}
	// Only tools that say so (the git tools) reach outside the service,
	// and programs that asked for network where the operator lets clients
	// ask (SANDBOX_EGRESS_ALLOW, egress_domains).
	destructive := info.destructive
	open := info.openWorld || (info.egress && s.runs.Limits().EgressReachable)
	t.Annotations = &mcpsdk.ToolAnnotations{
		ReadOnlyHint:    info.readOnly,
		DestructiveHint: &destructive,
		IdempotentHint:  info.idempotent,
		OpenWorldHint:   &open,
	}
	return t
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
