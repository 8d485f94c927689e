package runbox

import (
	"fmt"
	"time"
)

// SessionRef names an MCP session.
type SessionRef struct {
	Client, ID string
}

// ExecutionLimits bound the live executions of a session and of the
// deployment (0: none).
type ExecutionLimits struct {
	PerSession, Total int
}

// ErrTooManyExecutions is the store's refusal of an execution's place
// (ReserveExecution).
type ErrTooManyExecutions struct {
	// Total is set when the deployment's limit refused, else the
	// session's.
	Total bool
	Limit int
}

func (e *ErrTooManyExecutions) Error() string {
	if e.Total {
		return fmt.Sprintf("%d executions are running, the server's limit", e.Limit)
	}
	return fmt.Sprintf("this session has %d executions running, its limit", e.Limit)
}

// Reservation is a place taken for an execution whose run is being made.
// Only the store that made it reads its fields.
type Reservation struct {
	Session SessionRef
	Member  string
}

// Execution is what a session remembers of an execution besides its run.
type Execution struct {
	RunID          string
	Command        string
	TimeoutSeconds int
}

// Project is a conversation running a template's dev server: the security
// gateway's sandbox (create_sandbox_for_project). Its record lives until
// it expires; the janitor then closes the conversation.
type Project struct {
	Conversation string    `json:"conversation"` // key
	Name         string    `json:"name"`
	Template     string    `json:"template"`
	Port         int       `json:"port"`
	RunID        string    `json:"run_id"`
	CreatedAt    time.Time `json:"created_at"`
	ExpiresAt    time.Time `json:"expires_at"`
}

// ErrProjectNotFound reports a project that does not exist or expired.
var ErrProjectNotFound = Errorf(ENotFound, "no such project")

// ErrPreviewNotFound reports a preview record that does not exist (or has
// expired).
var ErrPreviewNotFound = Errorf(ENotFound, "no such preview")

// PreviewRecord is what a preview URL stands for.
type PreviewRecord struct {
	Client       string `json:"client"`
	Conversation string `json:"conversation"` // its key
	Executor     string `json:"executor"`
	// Sandboxes are the conversation's sandboxes when the URL was issued:
	// the URL serves while one of them lives, and never another's.
	Sandboxes []string `json:"sandboxes"`
}
