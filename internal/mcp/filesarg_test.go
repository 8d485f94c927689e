package mcp

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	mcpsdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/runbox-dev/runbox"
)

type filesIn struct {
	Files Files `json:"files" jsonschema:"the files"`
}

// TestFilesShapes: a tool that takes Files accepts the security gateway's
// record {path: content} and runbox's list alike, over MCP (the schema the
// SDK checks first admits both), and refuses anything else before it runs.
func TestFilesShapes(t *testing.T) {
	f := newFixture(t, nil)
	var got Files
	AddTool(f.srv, &mcpsdk.Tool{Name: "family_files"}, ToolSpec{},
		func(_ context.Context, in filesIn) (echoOut, error) {
			got = in.Files
			return echoOut{OK: true}, nil
		})
	ctx := context.Background()
	for _, tt := range []struct {
		name  string
		files string
		want  string // got, formatted; "" for a refusal
	}{
		{"the gateway's record, by path", `{"src/b.js": "b", "a.js": "a", "c.txt": ""}`, "[{a.js a } {c.txt  } {src/b.js b }]"},
		{"a record's key twice: the last, as JSON reads it", `{"a.js": "1", "a.js": "2"}`, "[{a.js 2 }]"},
		{"runbox's list", `[{"path": "a.png", "content": "iVBORw0K", "encoding": "base64"}, {"path": "b", "content": "x"}]`,
			"[{a.png iVBORw0K base64} {b x }]"},
		{"an empty record", `{}`, "[]"},
		{"a string", `"a.js"`, ""},
		{"a record of objects", `{"a.js": {"content": "x"}}`, ""},
		{"a list of strings", `["a.js"]`, ""},
		{"a list entry with an unknown field", `[{"path": "a", "content": "x", "mode": "0755"}]`, ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got = nil
			res, err := f.cs.CallTool(ctx, &mcpsdk.CallToolParams{Name: "family_files", Arguments: json.RawMessage(`{"files": ` + tt.files + `}`)})
			if err != nil {
				t.Fatal(err)
			}
			if tt.want == "" {
				if !res.IsError || got != nil {
					t.Errorf("accepted: %v", got)
				}
				return
			}
			if res.IsError || fmt.Sprint(got) != tt.want {
				t.Errorf("got %v (isError %v), want %s", got, res.IsError, tt.want)
			}
		})
	}
	list, err := f.cs.ListTools(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, tool := range list.Tools {
		if b, _ := json.Marshal(tool.InputSchema); tool.Name == "family_files" &&
			(!strings.Contains(string(b), `"anyOf"`) || !strings.Contains(string(b), `"additionalProperties":{"type":"string"}`) || !strings.Contains(string(b), `"the files"`)) {
			t.Errorf("input schema %s", b)
		}
	}
}

func TestFileArgData(t *testing.T) {
	for _, tt := range []struct {
		f    FileArg
		want string
		code string
	}{
		{FileArg{Path: "a", Content: "text"}, "text", ""},
		{FileArg{Path: "a", Content: "aGk=", Encoding: "BASE64"}, "hi", ""},
		{FileArg{Path: "a", Content: "12345"}, "", runbox.EFileSizeExceeded},
		{FileArg{Path: "a", Content: "aGVsbG8=", Encoding: "base64"}, "", runbox.EFileSizeExceeded},
		{FileArg{Path: "a", Content: strings.Repeat("A", 100), Encoding: "base64"}, "", runbox.EFileSizeExceeded},
		{FileArg{Path: "a", Content: "!!", Encoding: "base64"}, "", runbox.EInvalid},
		{FileArg{Path: "a", Content: "x", Encoding: "latin1"}, "", runbox.EInvalid},
	} {
		data, err := tt.f.Data(4)
		if runbox.ErrorCode(err) != tt.code && !(err == nil && tt.code == "") || string(data) != tt.want {
			t.Errorf("%+v: %q %v, want %q %s", tt.f, data, err, tt.want, tt.code)
		}
	}
}
