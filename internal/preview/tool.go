package preview

import (
	"cmp"
	"context"

	mcpsdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/runbox-dev/runbox/internal/mcp"
	"github.com/runbox-dev/runbox/internal/runs"
)

// Input are get_preview_url's arguments.
type Input struct {
	ConversationID string `json:"conversationId,omitempty" jsonschema:"the conversation whose program listens"`
	SessionID      string `json:"session_id,omitempty" jsonschema:"another name for conversationId"`
	Port           int    `json:"port" jsonschema:"the TCP port the program listens on inside the sandbox (on 0.0.0.0 or 127.0.0.1)"`
}

// Register adds get_preview_url to the MCP server.
func Register(s *mcp.Server, svc *Service) {
	mcp.AddTool(s, &mcpsdk.Tool{
		Name: "get_preview_url",
		Description: "Return a URL a browser can open to reach a server a program of the conversation runs " +
			"(start it with run_code background: true, or start_run), listening on port inside the sandbox. " +
			"HTTP and WebSocket are passed through; the page is the root of its own origin, so absolute paths work. " +
			"Anyone holding the URL may browse it until expires_at; it stops working when the sandbox ends. " +
			"not_listening when nothing listens on the port.",
	}, mcp.ToolSpec{}, func(ctx context.Context, in Input) (URL, error) {
		return svc.IssueFor(ctx, cmp.Or(in.ConversationID, in.SessionID), in.Port)
	})
}

// IssueFor issues a URL for port of the caller's conversation id.
func (s *Service) IssueFor(ctx context.Context, id string, port int) (URL, error) {
	key, err := runs.ConversationKey(ctx, id)
	if err != nil {
		return URL{}, err
	}
	return s.Issue(ctx, key, port)
}
