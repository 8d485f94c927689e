package gitexport

import (
	mcpsdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/runbox-dev/runbox"
	"github.com/runbox-dev/runbox/internal/mcp"
)

// Tool names, as the security gateway gives them.
const (
	ToolCommit = "commit_and_push_to_github"
	ToolRead   = "read_github_file"
)

// Register adds the git tools to the MCP server. Commits add to a branch's
// history (nothing is lost, so not destructive) and are not idempotent; a
// read is both read-only and idempotent; both reach the forge (open
// world).
func Register(s *mcp.Server, svc *Service) {
	// The gateway's dialect, with its names for runbox's own codes, which
	// the git tools' errors may carry too (a bad argument, a missing
	// conversation file, a forge that does not answer).
	gateway := mcp.Gateway(map[string]string{
		runbox.EInvalid:     "INVALID_ARGUMENT",
		runbox.ENotFound:    "NOT_FOUND",
		runbox.EBusy:        "UNAVAILABLE",
		runbox.EUnavailable: "UNAVAILABLE",
		runbox.EInternal:    "INTERNAL_ERROR",
	})
	mcp.AddTool(s, &mcpsdk.Tool{
		Name: ToolCommit,
		Description: "Commit files to a branch of a configured git repository (GitHub, Gitea, Forgejo) as one commit, and " +
			"optionally open a pull request into its base branch. Send files inline (path and content; binary as base64), " +
			"or conversationId and paths to commit files the conversation's programs wrote to /data. At most 10 files of " +
			"500 KB each; the branch must match the repository's allowed patterns and cannot be its base branch.",
	}, mcp.ToolSpec{OpenWorld: true, Dialect: gateway}, svc.Commit)
	mcp.AddTool(s, &mcpsdk.Tool{
		Name: ToolRead,
		Description: "Read a file from a configured git repository: the base branch (default) or an allowed branch. " +
			"Text comes as it is; anything else as base64 with binary: true. At most 1 MB.",
	}, mcp.ToolSpec{ReadOnly: true, Idempotent: true, OpenWorld: true, Dialect: gateway}, svc.Read)
}
