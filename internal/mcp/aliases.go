package mcp

import (
	"context"
	"encoding/json"

	mcpsdk "github.com/modelcontextprotocol/go-sdk/mcp"
)

// alias is a tool name some clients use for one of ours. Aliases are
// answered but not listed.
type alias struct {
	tool     string
	language string // a fixed language argument, if any
}

var toolAliases = map[string]alias{
	"sandbox.run_code":     {tool: "run_code"},
	"sandbox.list_runners": {tool: "list_runners"},
}

// aliases rewrites calls of an alias into calls of its tool.
func aliases(next mcpsdk.MethodHandler) mcpsdk.MethodHandler {
	return func(ctx context.Context, method string, req mcpsdk.Request) (mcpsdk.Result, error) {
		if r, ok := req.(*mcpsdk.CallToolRequest); ok && r.Params != nil {
			if a, ok := toolAliases[r.Params.Name]; ok {
				r.Params.Name = a.tool
				if a.language != "" {
					r.Params.Arguments = withArgument(r.Params.Arguments, "language", a.language)
				}
			}
		}
		return next(ctx, method, req)
	}
}

// withArgument sets one argument of a call. Arguments that are not an
// object are left for the tool's validation to reject.
func withArgument(raw json.RawMessage, key, value string) json.RawMessage {
	args := map[string]json.RawMessage{}
	if len(raw) > 0 {
		if err := json.Unmarshal(raw, &args); err != nil {
			return raw
		}
	}
	v, _ := json.Marshal(value)
	args[key] = v
	b, err := json.Marshal(args)
	if err != nil {
		return raw
	}
	return b
}
