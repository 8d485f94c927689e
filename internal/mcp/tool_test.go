package mcp

import (
	"context"
	"encoding/json"
	"testing"

	"github.com/google/jsonschema-go/jsonschema"
	mcpsdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/runbox-dev/runbox"
)

type echoIn struct {
	Fail string `json:"fail,omitempty"`
}

type echoOut struct {
	OK bool `json:"ok"`
}

type otherOut struct {
	Other string `json:"other"`
}

// TestAddTool: a tool another package adds is described (schemas from
// its types, annotations from its spec), answers, and speaks its
// dialect in its errors.
func TestAddTool(t *testing.T) {
	f := newFixture(t, nil)
	AddTool(f.srv, &mcpsdk.Tool{Name: "family_echo", Description: "test"},
		ToolSpec{ReadOnly: true, Idempotent: true, OpenWorld: true, Dialect: Gateway(map[string]string{runbox.EInvalid: "INVALID_ARGUMENT"})},
		func(_ context.Context, in echoIn) (echoOut, error) {
			switch in.Fail {
			case "invalid":
				return echoOut{}, runbox.Errorf(runbox.EInvalid, "bad")
			case "path":
				return echoOut{}, runbox.Errorf(runbox.EInvalidPath, "bad")
			case "other":
				return echoOut{}, runbox.Errorf(runbox.ENotFound, "none")
			}
			return echoOut{OK: true}, nil
		})
	ctx := context.Background()
	list, err := f.cs.ListTools(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, tool := range list.Tools {
		if tool.Name == "family_echo" {
			if a := tool.Annotations; !a.ReadOnlyHint || !a.IdempotentHint || *a.DestructiveHint || !*a.OpenWorldHint {
				t.Errorf("described as %+v", a)
			}
			if got, want := schemaJSON(t, tool.OutputSchema), schemaJSON(t, &jsonschema.Schema{Type: "object",
				AnyOf: []*jsonschema.Schema{outputSchemaOf[echoOut](), toolErrorSchema}}); got != want {
				t.Errorf("output schema %s, want %s", got, want)
			}
		} else if *tool.Annotations.OpenWorldHint {
			t.Errorf("%s is open world", tool.Name)
		}
	}
	for fail, want := range map[string]string{"": "", "invalid": "INVALID_ARGUMENT", "path": runbox.EPathTraversal, "other": runbox.ENotFound} {
		res, body := call(t, f.cs, &mcpsdk.CallToolParams{Name: "family_echo", Arguments: map[string]any{"fail": fail}})
		if got, _ := body["error"].(string); got != want || res.IsError != (want != "") {
			t.Errorf("fail=%q: %v (isError %v), want %q", fail, body, res.IsError, want)
		}
	}
}

// TestAddToolTwice: a name is one tool's — a tool's or an alias's.
func TestAddToolTwice(t *testing.T) {
	f := newFixture(t, nil)
	echo := func(context.Context, echoIn) (echoOut, error) { return echoOut{}, nil }
	for _, tt := range []struct {
		name    string
		aliases []string
	}{{"run_code", nil}, {"sandbox.run_code", nil}, {"family_new", []string{"list_runners"}}, {"family_new", []string{"sandbox.list_runners"}}} {
		func() {
			defer func() {
				if recover() == nil {
					t.Errorf("%s %v was added", tt.name, tt.aliases)
				}
			}()
			AddTool(f.srv, &mcpsdk.Tool{Name: tt.name}, ToolSpec{Aliases: tt.aliases}, echo)
		}()
	}
}

// TestAnswers: an Answer's content goes along with its structured form
// (the JSON as text without one), a OneOf answers either type and its
// schema admits both, and an answer of no type is refused.
func TestAnswers(t *testing.T) {
	f := newFixture(t, nil)
	AddTool(f.srv, &mcpsdk.Tool{Name: "family_answer"}, ToolSpec{Aliases: []string{"family.answer"}},
		func(_ context.Context, in echoIn) (Answer[echoOut], error) {
			if in.Fail == "" {
				return Answer[echoOut]{Value: echoOut{OK: true}}, nil
			}
			return Answer[echoOut]{Value: echoOut{OK: true}, Content: []mcpsdk.Content{&mcpsdk.TextContent{Text: "shown"}}}, nil
		})
	AddTool(f.srv, &mcpsdk.Tool{Name: "family_oneof"}, ToolSpec{},
		func(_ context.Context, in echoIn) (OneOf[echoOut, otherOut], error) {
			if in.Fail == "" {
				return OneOf[echoOut, otherOut]{First: &echoOut{OK: true}}, nil
			}
			return OneOf[echoOut, otherOut]{Second: &otherOut{Other: in.Fail}}, nil
		})
	for _, tt := range []struct {
		tool, arg, text string
		want            map[string]any
	}{
		{"family_answer", "", `{"ok":true}`, map[string]any{"ok": true}},
		{"family.answer", "x", "shown", map[string]any{"ok": true}},
		{"family_oneof", "", `{"ok":true}`, map[string]any{"ok": true}},
		{"family_oneof", "x", `{"other":"x"}`, map[string]any{"other": "x"}},
	} {
		res, body := call(t, f.cs, &mcpsdk.CallToolParams{Name: tt.tool, Arguments: map[string]any{"fail": tt.arg}})
		got, _ := json.Marshal(body)
		want, _ := json.Marshal(tt.want)
		if res.IsError || string(got) != string(want) || len(res.Content) != 1 || res.Content[0].(*mcpsdk.TextContent).Text != tt.text {
			t.Errorf("%s(%q): %s %v, want %s and text %s", tt.tool, tt.arg, got, res.Content, want, tt.text)
		}
	}
	if got, want := schemaJSON(t, outputSchemaOf[OneOf[echoOut, otherOut]]()),
		schemaJSON(t, &jsonschema.Schema{AnyOf: []*jsonschema.Schema{outputSchemaOf[echoOut](), outputSchemaOf[otherOut]()}}); got != want {
		t.Errorf("OneOf's schema %s, want %s", got, want)
	}
	defer func() {
		if recover() == nil {
			t.Error("an answer of type any was accepted")
		}
	}()
	AddTool(f.srv, &mcpsdk.Tool{Name: "family_any"}, ToolSpec{}, func(context.Context, echoIn) (any, error) { return nil, nil })
}

// schemaJSON is a schema as JSON with its keys in order, whatever its
// type (a client reads it into a map).
func schemaJSON(t *testing.T, s any) string {
	t.Helper()
	b, err := json.Marshal(s)
	if err != nil {
		t.Fatal(err)
	}
	var v any
	if err := json.Unmarshal(b, &v); err != nil {
		t.Fatal(err)
	}
	b, _ = json.Marshal(v)
	return string(b)
}
