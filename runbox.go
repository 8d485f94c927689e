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
	// Parallel runs neither wait in nor hold their conversation's order:
	// they start beside its other runs (in a sandbox of their own,
	// mounting the same folder) and detach as soon as their program has
	// started.
	Parallel bool `json:"parallel,omitempty"`
	// Detach has the run leave its conversation's order and give back its
	// executor's slot once its program has started, while the program runs
	// on to its end (or its timeout, a cancel, the executor's shutdown);
	// a detached event says when. runs.Service.WaitDetached waits for it.
	Detach bool `json:"detach,omitempty"`
	// Network is what the program may reach outside its sandbox; nil (or
	// no domain): nothing.
	Network *Network `json:"network,omitempty"`
	// Packages are installed into the conversation before the program
	// runs: pip requirements for Python, npm packages for TypeScript.
	Packages []string `json:"packages,omitempty"`
	// PackageDomains is what installing Packages may reach: the client's
	// allowlist when the run was admitted (the index and the hosts it
	// points to).
	PackageDomains []string `json:"package_domains,omitempty"`
	// Background keeps the program running after the call that started
	// it returns: a server, which a preview URL may reach. It leaves its
	// conversation's order and its executor's slot once started, and
	// ends when cancelled, closed, idle past SANDBOX_SERVER_TTL, or out of
	// time (its timeout: what the client's tier has left).
	Background bool `json:"background,omitempty"`
	// Command marks a shell command of the commands tools (execute_code):
	// its time limit is theirs (SANDBOX_TIMEOUT), not run_code's.
	Command bool `json:"command,omitempty"`
	// Filesystem narrows what the program may read and write inside its
	// sandbox; nil: what the sandbox allows.
	Filesystem *Filesystem `json:"filesystem,omitempty"`
	// Secrets names the operator's secrets (SANDBOX_SECRETS_FILE) the
	// run's requests to their domains carry; its program finds only
	// placeholders of them in its environment. Names, never values.
	Secrets []string `json:"secrets,omitempty"`
	// CallbackURL is where the run's end is told (a webhook); empty: the
	// client's default, if it has one.
	CallbackURL string `json:"callback_url,omitempty"`
	// Pause runs no program: the executor that holds the conversation's
	// kept interpreter saves its state and lets its sandbox go
	// (pause_session). Set by the service, never by a client.
	Pause bool `json:"pause,omitempty"`
}

// Filesystem is what a program may write and read inside its sandbox,
// enforced by the kernel (Landlock) on the program and all it starts.
// Paths are absolute; each names a file or a folder and all beneath it.
type Filesystem struct {
	// AllowWrite, when not nil, are the only places the program may
	// write: an empty list, nowhere (so it is kept as [], never omitted).
	AllowWrite []string `json:"allow_write"`
	// DenyRead and DenyWrite are places it may not read, or write.
	DenyRead  []string `json:"deny_read,omitempty"`
	DenyWrite []string `json:"deny_write,omitempty"`
}

// Network is what a run may reach outside its sandbox.
type Network struct {
	AllowedDomains []string `json:"allowed_domains" jsonschema:"domain names (or *.domain patterns) the program may reach over HTTP(S) through the egress proxy; each must be within this client's allowlist"`
}

// Domains returns the domains a run asked to reach.
func (s Spec) Domains() []string {
	if s.Network == nil {
		return nil
	}
	return s.Network.AllowedDomains
}

// Egress is a connection a run made, or was refused, through the egress
// proxy: the name and port it asked for, the bytes it received and sent.
type Egress struct {
	Host     string `json:"host"`
	Port     int    `json:"port"`
	BytesIn  int64  `json:"bytes_in"`
	BytesOut int64  `json:"bytes_out"`
	Allowed  bool   `json:"allowed"`
	// Reason says why it was refused, or why an allowed one was cut or
	// failed.
	Reason string `json:"reason,omitempty"`
	// Secrets names the secrets the run's requests on this connection
	// carried (never their values).
	Secrets []string `json:"secrets,omitempty"`
	// Count, when set, says how many connections this record stands for:
	// past a run's first 1000, connections are counted by host, port,
	// outcome and reason (their bytes added up), so that a program
	// opening connections in a loop cannot grow its records without
	// bound.
	Count int `json:"count,omitempty"`
}

// TermGrace is how long a program asked to stop (SIGTERM: a cancel
// without force) has before it is killed.
const TermGrace = 5 * time.Second

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
	// last one: closed, its executor killed, or its state not saved).
	StateLost bool `json:"state_lost,omitempty"`
	// StateRestored says that the kept interpreter was restored from a
	// pause (automatic or asked for) before this run: its variables are
	// back, but for LostVariables, those that could not be kept (open
	// sockets, threads, generators).
	StateRestored bool     `json:"state_restored,omitempty"`
	LostVariables []string `json:"lost_variables,omitempty"`
	// StatePaused says, for pause_session, that the state was saved;
	// StateBytes is what it takes in the conversation's quota.
	StatePaused bool  `json:"state_paused,omitempty"`
	StateBytes  int64 `json:"state_bytes,omitempty"`
	// Running says that a background program still runs: the result is
	// what it printed until it started (exit_code -1 until it ends).
	Running bool `json:"running,omitempty"`
	// Phase says, for a compiled language, which phase ended the run:
	// PhaseCompile (the compiler failed: its messages are in stderr, its
	// exit code is ExitCode) or PhaseRun. Empty for interpreted languages.
	Phase          string     `json:"phase,omitempty"`
	DurationMS     int64      `json:"duration_ms"`
	RunID          string     `json:"run_id"`
	ConversationID string     `json:"conversationId"`
	Files          []FileInfo `json:"files"`
	Artifacts      []FileInfo `json:"artifacts"`
	// Egress lists the connections the run made or was refused, when it
	// asked for network or packages.
	Egress []Egress `json:"egress,omitempty"`
	// Packages is the conversation's installed set (name==version for
	// pip, name@version for npm), when the run asked for packages.
	Packages []string `json:"packages,omitempty"`
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
	EventEgress    = "egress" // a connection through the egress proxy, made or refused
	EventExit      = "exit"
	EventTimeout   = "timeout"
	EventCancelled = "cancelled"
	EventError     = "error"
	// EventDetached: the run left its conversation's order and its
	// executor's slot; its program runs on (Spec.Parallel, Spec.Detach).
	EventDetached = "detached"
	EventDone     = "done" // always last; carries the Result
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
	Egress     *Egress   `json:"egress,omitempty"`
	Result     *Result   `json:"result,omitempty"`
}

// Template is a project template: a runner image labelled
// sandbox.template=<name>, whose dev server listens on Port.
type Template struct {
	Name  string `json:"name"`
	Image string `json:"image"`
	Port  int    `json:"port"`
}

// TemplateLanguage is the Spec.Language of a run in a template's image
// (a project's dev server): no language is named so, and no client may
// ask for it.
func TemplateLanguage(template string) string { return "@" + template }

// Runner is a language the service can run, and the image that runs it.
type Runner struct {
	Language string `json:"language"`
	Image    string `json:"image"`
	Version  string `json:"version"`
}
