package mcp

import (
	"context"
	"encoding/json"
	"testing"

	mcpsdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/runbox-dev/runbox"
)

type echoIn struct {
	Fail string `json:"fail,omitempty"`
}

type echoOut struct {
	OK bool `json:"ok"`
}

// TestFamilyTool: a tool another package adds is described (schema,
// annotations), answers, and speaks its own codes in its errors.
func TestFamilyTool(t *testing.T) {
	f := newFixture(t, nil)
	AddTool(f.srv, &mcpsdk.Tool{Name: "family_echo", Description: "test"},
		ToolSpec{Out: SchemaOf[echoOut](), ReadOnly: true, Idempotent: true, OpenWorld: true, Codes: map[string]string{runbox.EInvalid: "INVALID_ARGUMENT"}},
		func(_ context.Context, in echoIn) (echoOut, error) {
			switch in.Fail {
			case "invalid":
				return echoOut{}, runbox.Errorf(runbox.EInvalid, "bad")
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
			if a := tool.Annotations; !a.ReadOnlyHint || !a.IdempotentHint || *a.DestructiveHint || !*a.OpenWorldHint || tool.OutputSchema == nil {
				t.Errorf("described as %+v", a)
			}
		} else if *tool.Annotations.OpenWorldHint {
			t.Errorf("%s is open world", tool.Name)
		}
	}
	for fail, want := range map[string]string{"": "", "invalid": "INVALID_ARGUMENT", "other": runbox.ENotFound} {
		res, err := f.cs.CallTool(ctx, &mcpsdk.CallToolParams{Name: "family_echo", Arguments: map[string]any{"fail": fail}})
		if err != nil {
			t.Fatal(err)
		}
		var body map[string]any
		b, _ := json.Marshal(res.StructuredContent)
		json.Unmarshal(b, &body)
		if got, _ := body["error"].(string); got != want || res.IsError != (want != "") {
			t.Errorf("fail=%q: %v (isError %v), want %q", fail, body, res.IsError, want)
		}
	}
	defer func() {
		if recover() == nil {
			t.Error("a tool added twice was accepted")
		}
	}()
	AddTool(f.srv, &mcpsdk.Tool{Name: "run_code"}, ToolSpec{Out: SchemaOf[echoOut]()},
		func(context.Context, echoIn) (echoOut, error) { return echoOut{}, nil })
}
