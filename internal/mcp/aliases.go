package mcp

import (
	"context"

	mcpsdk "github.com/modelcontextprotocol/go-sdk/mcp"
)

// aliases rewrites calls of a tool's alias (ToolSpec.Aliases) into calls
// of the tool.
func (s *Server) aliases(next mcpsdk.MethodHandler) mcpsdk.MethodHandler {
	return func(ctx context.Context, method string, req mcpsdk.Request) (mcpsdk.Result, error) {
		if r, ok := req.(*mcpsdk.CallToolRequest); ok && r.Params != nil {
			if tool, ok := s.tools.tool(r.Params.Name); ok {
				r.Params.Name = tool
			}
		}
		return next(ctx, method, req)
	}
}
