package runbox

import "time"

// E2BSandbox is a sandbox as E2B's SDKs know it (internal/e2b): a
// conversation of its client, whose id is the sandbox's, with a daemon
// serving E2B's sandbox API in it (its background run) and the lifetime
// E2B gives a sandbox.
type E2BSandbox struct {
	ID       string `json:"id"`
	Client   string `json:"client"`
	Template string `json:"template"`
	// Language is the runner its daemon runs on; Interpreter says that it
	// serves E2B's code interpreter too (kept Python state).
	Language    string `json:"language"`
	Interpreter bool   `json:"interpreter,omitempty"`
	// Salt makes its access tokens its own: they are derived from it and
	// the deployment's secret, never stored.
	Salt      string    `json:"salt"`
	StartedAt time.Time `json:"started_at"`
	// EndAt is when it is killed (or paused, with AutoPause) unless its
	// timeout is moved; Deadline is the latest its daemon's run may last
	// (what the client's tier allowed it), past which EndAt never goes.
	EndAt    time.Time `json:"end_at"`
	Deadline time.Time `json:"deadline"`
	State    string    `json:"state"`
	// Run is its daemon's run while it runs.
	Run      string            `json:"run,omitempty"`
	Metadata map[string]string `json:"metadata,omitempty"`
	// EnvVars, Network and Secrets are what its daemon's run is started
	// with, each time it is (created, resumed).
	EnvVars map[string]string `json:"env_vars,omitempty"`
	Network *Network          `json:"network,omitempty"`
	Secrets []string          `json:"secrets,omitempty"`
	// AllowInternet is what the client asked (nil: nothing said).
	AllowInternet *bool `json:"allow_internet,omitempty"`
	AutoPause     bool  `json:"auto_pause,omitempty"`
	AutoResume    bool  `json:"auto_resume,omitempty"`
	// PrivateTraffic asks for its traffic token on the host of each of
	// its ports (allowPublicTraffic false).
	PrivateTraffic bool `json:"private_traffic,omitempty"`
	// Contexts are its code interpreter's contexts besides the default.
	Contexts []E2BContext `json:"contexts,omitempty"`
	// Version counts its saves: a save of a stale copy fails.
	Version int64 `json:"version"`
}

// States of an E2B sandbox.
const (
	E2BRunning = "running"
	E2BPaused  = "paused"
)

// E2BContext is a context of an E2B sandbox's code interpreter.
type E2BContext struct {
	ID       string `json:"id"`
	Language string `json:"language"`
	Cwd      string `json:"cwd"`
}

// ErrE2BSandboxNotFound reports an E2B sandbox that does not exist (or no
// longer does).
var ErrE2BSandboxNotFound = Errorf(ENotFound, "no such sandbox")

// ErrE2BConflict reports a save of an E2B sandbox's record saved since it
// was read.
var ErrE2BConflict = Errorf(EConversationExists, "the sandbox changed since it was read")
