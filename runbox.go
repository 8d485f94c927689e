// Package runbox holds the domain of the code execution service: what a run
// is asked to do (Spec), what it produced (Result), what happened on the way
// (Event), and the one error type every edge maps to HTTP statuses and MCP
// tool errors. The adapters around it (Redis, Docker, HTTP, MCP) live under
// internal/ and do not know about each other.
package runbox

import "time"

// Spec is what a client asks to run.
type Spec struct {
	Language       string            `json:"language"`
	Code           string            `json:"code"`
	ConversationID string            `json:"conversationId"`
	TimeoutSeconds int               `json:"timeout_seconds,omitempty"`
	Stdin          string            `json:"stdin,omitempty"`
	Env            map[string]string `json:"env,omitempty"`
	// Interactive keeps the program's stdin open for input sent later.
	Interactive bool `json:"interactive,omitempty"`
	// KeepState runs Python code in the conversation's kept interpreter.
	KeepState bool `json:"keep_state,omitempty"`
}

// Timeout is the run's wall-clock limit.
func (s Spec) Timeout() time.Duration { return time.Duration(s.TimeoutSeconds) * time.Second }

// FileInfo describes a file in a conversation's /data.
type FileInfo struct {
	Name      string `json:"name"`
	Path      string `json:"path"`
	SizeBytes int64  `json:"size_bytes"`
	MimeType  string `json:"mime_type"`
	URL       string `json:"url"`
}

// Result is how a run ended.
type Result struct {
	Success         bool   `json:"success"`
	Output          string `json:"output"`
	ExitCode        int    `json:"exit_code"`
	Stdout          string `json:"stdout"`
	Stderr          string `json:"stderr"`
	StdoutTruncated bool   `json:"stdout_truncated"`
	StderrTruncated bool   `json:"stderr_truncated"`
	TimedOut        bool   `json:"timed_out"`
	OOMKilled       bool   `json:"oom_killed"`
	Cancelled       bool   `json:"cancelled,omitempty"`
	// StateLost says that a kept-state run did not find the state earlier
	// runs left: its interpreter was lost (with this run, or since the
	// last one: idle, evicted, closed, or its executor restarted).
	StateLost bool `json:"state_lost,omitempty"`
	// Phase says, for a compiled language, which phase ended the run:
	// PhaseCompile (the compiler failed: its messages are in stderr, its
	// exit code is ExitCode) or PhaseRun. Empty for interpreted languages.
	Phase          string     `json:"phase,omitempty"`
	DurationMS     int64      `json:"duration_ms"`
	RunID          string     `json:"run_id"`
	ConversationID string     `json:"conversationId"`
	Files          []FileInfo `json:"files"`
	Artifacts      []FileInfo `json:"artifacts"`
	// Error says why the service could not run the program to its end; it
	// is empty when the program itself decided the outcome.
	Error string `json:"error,omitempty"`
}

// Values of Result.Phase.
const (
	PhaseCompile = "compile"
	PhaseRun     = "run"
)

// Status is where a run is in its life.
type Status string

const (
	StatusQueued    Status = "queued"
	StatusRunning   Status = "running"
	StatusSucceeded Status = "succeeded" // exited 0
	StatusFailed    Status = "failed"    // exited non-zero or was killed for memory
	StatusTimedOut  Status = "timed_out"
	StatusCancelled Status = "cancelled"
	StatusError     Status = "error" // the service could not run it to its end
)

// Final reports whether a run in this status will not change again.
func (s Status) Final() bool {
	switch s {
	case StatusQueued, StatusRunning:
		return false
	}
	return true
}

// Run is a run's record.
type Run struct {
	ID             string    `json:"run_id"`
	ConversationID string    `json:"conversationId"`
	Language       string    `json:"language"`
	Status         Status    `json:"status"`
	Interactive    bool      `json:"interactive,omitempty"`
	CreatedAt      time.Time `json:"created_at"`
	StartedAt      time.Time `json:"started_at,omitzero"`
	FinishedAt     time.Time `json:"finished_at,omitzero"`
	Result         *Result   `json:"result,omitempty"`
}

// Event types, in the order a run produces them.
const (
	EventQueued    = "queued"
	EventStarted   = "started"
	EventStdout    = "stdout"
	EventStderr    = "stderr"
	EventExit      = "exit"
	EventTimeout   = "timeout"
	EventCancelled = "cancelled"
	EventError     = "error"
	EventDone      = "done" // always last; carries the Result
)

// Event is one entry of a run's event log. Seq counts from 1 without gaps.
type Event struct {
	Seq        int64     `json:"seq,omitempty"`
	TS         time.Time `json:"ts"`
	Type       string    `json:"type"`
	Data       string    `json:"data,omitempty"`
	ExitCode   *int      `json:"exit_code,omitempty"`
	DurationMS *int64    `json:"duration_ms,omitempty"`
	Message    string    `json:"message,omitempty"`
	Result     *Result   `json:"result,omitempty"`
}

// Runner is a language the service can run, and the image that runs it.
type Runner struct {
	Language string `json:"language"`
	Image    string `json:"image"`
	Version  string `json:"version"`
}
