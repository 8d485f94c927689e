package mcp

import (
	"cmp"
	"context"
	"encoding/json"

	mcpsdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/runbox-dev/runbox"
	"github.com/runbox-dev/runbox/internal/audit"
	"github.com/runbox-dev/runbox/internal/auth"
)

// countCalls holds tool calls to the caller's calls_per_minute. Only
// tools/call counts: initialize, tools/list and pings do not, so that a
// limited client still reaches the tool error that tells it when to come
// back.
func (s *Server) countCalls(next mcpsdk.MethodHandler) mcpsdk.MethodHandler {
	return func(ctx context.Context, method string, req mcpsdk.Request) (mcpsdk.Result, error) {
		if r, ok := req.(*mcpsdk.CallToolRequest); ok {
			if err := s.runs.AllowCall(ctx); err != nil {
				name := ""
				if r.Params != nil {
					name = r.Params.Name
				}
				res, _, err := s.toolError(ctx, s.tools.dialect(name), err)
				if err != nil {
					return nil, err
				}
				return res, nil
			}
		}
		return next(ctx, method, req)
	}
}

// recordCalls writes every tool call to the audit log: its start before
// it runs (a call whose start cannot be written does not run), its end
// with the outcome.
func (s *Server) recordCalls(next mcpsdk.MethodHandler) mcpsdk.MethodHandler {
	return func(ctx context.Context, method string, req mcpsdk.Request) (mcpsdk.Result, error) {
		r, ok := req.(*mcpsdk.CallToolRequest)
		if !ok || s.audit == nil || r.Params == nil {
			return next(ctx, method, req)
		}
		var args map[string]any
		_ = json.Unmarshal(r.Params.Arguments, &args)
		str := func(k string) string { v, _ := args[k].(string); return v }
		call, err := s.audit.Begin(ctx, audit.Entry{
			Client: auth.Client(ctx), Tool: r.Params.Name,
			Conversation: cmp.Or(str("conversationId"), str("session_id"), str("sandbox_id")), RunID: cmp.Or(str("run_id"), str("execution_id")),
			Params: audit.Sanitize(args),
		})
		if err != nil {
			res, _, terr := s.toolError(ctx, Dialect{}, err)
			return res, terr
		}
		res, err := next(ctx, method, req)
		code, runID := "", ""
		switch {
		case err != nil:
			code = runbox.ErrorCode(err)
		default:
			if tr, ok := res.(*mcpsdk.CallToolResult); ok {
				if m, ok := structured(tr.StructuredContent); ok {
					runID, _ = m["run_id"].(string)
					if runID == "" {
						runID, _ = m["execution_id"].(string)
					}
					if tr.IsError {
						code, _ = m["error"].(string)
						code = cmp.Or(code, runbox.EInternal)
					}
				} else if tr.IsError {
					code = runbox.EInternal
				}
			}
		}
		call.End(ctx, code, runID)
		return res, err
	}
}

// structured returns a tool result's structured content as a map.
func structured(v any) (map[string]any, bool) {
	if m, ok := v.(map[string]any); ok {
		return m, true
	}
	b, err := json.Marshal(v)
	if err != nil {
		return nil, false
	}
	var m map[string]any
	return m, json.Unmarshal(b, &m) == nil && m != nil
}
