package commands

import (
	mcpsdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/runbox-dev/runbox/internal/mcp"
)

// Register adds the streaming sandbox server's tools to the MCP server.
// send_stdin takes their execution_id and input_data through the
// Service given to mcp.New as its Executions.
func Register(s *mcp.Server, svc *Service) {
	mcp.AddTool(s, &mcpsdk.Tool{
		Name: "execute_code",
		Description: "Run a shell command (bash) in this session's sandbox and wait for it: returns execution_id, status " +
			"(completed, timeout, cancelled, error), exit_code and output, a list of events (ready, stdout and stderr one per " +
			"line, exit, timeout, error, cancelled). The sandbox has python3 with pandas, numpy and matplotlib, node, git, " +
			"curl, jq and make; /data (also /mnt/data) is the session's folder, shared by its executions. With " +
			"wait_for_completion: false it returns at once with the execution_id (follow it with get_execution_output). " +
			"No network unless sandbox_config.network.allowed_domains names what it may reach.",
	}, mcp.ToolSpec{Destructive: true, Egress: true}, svc.Execute)
	mcp.AddTool(s, &mcpsdk.Tool{
		Name: "execute_code_async",
		Description: "Start a shell command in this session's sandbox and return at once with its execution_id; " +
			"follow it with get_execution_output or get_execution_status, end it with cancel_execution.",
	}, mcp.ToolSpec{Destructive: true, Egress: true}, svc.ExecuteAsync)
	mcp.AddTool(s, &mcpsdk.Tool{
		Name: "get_execution_output",
		Description: "An execution's status, exit_code and every output event so far; wait: true waits for it to end " +
			"(at most its timeout) first.",
	}, mcp.ToolSpec{ReadOnly: true, Idempotent: true}, svc.Output)
	mcp.AddTool(s, &mcpsdk.Tool{
		Name: "cancel_execution",
		Description: "Cancel an execution of this session: it gets SIGTERM and 5 s to end, then is killed; force: true " +
			"kills it at once. It ends cancelled.",
	}, mcp.ToolSpec{Destructive: true, Idempotent: true}, svc.Cancel)
	mcp.AddTool(s, &mcpsdk.Tool{
		Name:        "list_executions",
		Description: "The executions of this MCP session (its last 100, oldest first): id, status, command and times.",
	}, mcp.ToolSpec{ReadOnly: true, Idempotent: true}, svc.List)
	mcp.AddTool(s, &mcpsdk.Tool{
		Name:        "get_execution_status",
		Description: "An execution's status in detail: status, exit_code, command, started and completed times, duration.",
	}, mcp.ToolSpec{ReadOnly: true, Idempotent: true}, svc.Status)
}
