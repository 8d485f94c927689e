package e2e

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/google/jsonschema-go/jsonschema"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// TestToolSchemas: every tool declares an output schema and annotations;
// results and tool errors validate against the schema; run_code's
// artifacts come as resource links too.
func TestToolSchemas(t *testing.T) {
	s := start(t, options{})
	cs := s.session(nil)
	list, err := cs.ListTools(context.Background(), nil)
	if err != nil {
		t.Fatal(err)
	}
	schemas := map[string]*jsonschema.Resolved{}
	for _, tool := range list.Tools {
		if tool.OutputSchema == nil || tool.Annotations == nil || tool.Annotations.OpenWorldHint == nil || *tool.Annotations.OpenWorldHint {
			t.Errorf("tool %s: schema %v, annotations %+v", tool.Name, tool.OutputSchema != nil, tool.Annotations)
			continue
		}
		b, _ := json.Marshal(tool.OutputSchema)
		var sch jsonschema.Schema
		if err := json.Unmarshal(b, &sch); err != nil {
			t.Fatal(err)
		}
		r, err := sch.Resolve(nil)
		if err != nil {
			t.Fatalf("%s: %v", tool.Name, err)
		}
		schemas[tool.Name] = r
	}
	for name, want := range map[string]struct{ readOnly, destructive bool }{
		"list_runners": {true, false}, "list_files": {true, false}, "read_file": {true, false}, "get_run": {true, false},
		"list_runs": {true, false}, "close_session": {false, true}, "run_code": {false, true}, "start_run": {false, true},
	} {
		for _, tool := range list.Tools {
			if tool.Name == name && (tool.Annotations.ReadOnlyHint != want.readOnly || *tool.Annotations.DestructiveHint != want.destructive) {
				t.Errorf("%s annotations %+v", name, tool.Annotations)
			}
		}
	}
	validate := func(name string, res *mcp.CallToolResult) {
		t.Helper()
		var v any
		b, _ := json.Marshal(res.StructuredContent)
		json.Unmarshal(b, &v)
		if err := schemas[name].Validate(v); err != nil {
			t.Errorf("%s result does not validate: %v\n%s", name, err, b)
		}
	}
	res := call(t, cs, "run_code", map[string]any{"language": "python", "conversationId": "schemas",
		"code": "open('/data/a.csv','w').write('x,y\\n1,2\\n')\nprint('ok')"}, nil)
	validate("run_code", res)
	links := 0
	for _, c := range res.Content {
		if l, ok := c.(*mcp.ResourceLink); ok && l.Name == "a.csv" && l.MIMEType != "" && l.Size != nil && *l.Size == 8 && l.URI != "" {
			links++
		}
	}
	if links != 1 {
		t.Errorf("resource links: %d", links)
	}
	for name, args := range map[string]map[string]any{
		"list_runners": nil, "list_files": {"conversationId": "schemas"}, "read_file": {"conversationId": "schemas", "path": "/mnt/data/a.csv"},
		"list_runs": nil, "get_run": {"run_id": "run_000000000000000000000000"}, "close_session": {"conversationId": "nope"},
		"start_run": {"language": "bash", "code": "true"}, "upload_file": {"conversationId": "schemas", "filename": "b.txt", "content_base64": "eA=="},
		"get_preview_url":            {"conversationId": "schemas", "port": 9999},
		"create_sandbox_for_project": {"project_name": "x", "template": "next"},
		"write_files_to_sandbox":     {"sandbox_id": "3b241101-e2bb-4255-8caf-4136c566a962", "files": map[string]any{"a.js": "1"}},
		"get_sandbox_output":         {"sandbox_id": "3b241101-e2bb-4255-8caf-4136c566a962", "output_type": "console_log"},
	} {
		validate(name, call(t, cs, name, args, nil))
	}
}
