// Package engine is what the sandbox manager (package sandbox) and the
// engines that run its sandboxes say to each other: what a sandbox is made
// from (Spec), what an engine reports of the sandboxes and images it has,
// its errors (ErrNoRoom) and what it can do (Capabilities). The manager
// declares the engine it needs (sandbox.Engine); the engines are package
// docker (the Docker Engine's) and package kubernetes beside this one, and
// know this package alone of the manager's side. Nothing here knows an
// engine's API.
package engine

import (
	"errors"
	"io"
	"time"
)

// ErrNoRoom, from an engine's Create, says that the engine has no room
// for another sandbox now, and that removing one may make some (package
// sandbox's room.go).
var ErrNoRoom = errors.New("no room for another sandbox")

// Capabilities are what an engine's sandboxes can do beyond what every
// engine does. The process that wires an engine switches features on
// them, never on the engine's name: a feature an engine lacks is off, one
// it gains is a field here and a true in its Capabilities.
type Capabilities struct {
	// HostFolders: the sandboxes run on the executor's host and mount its
	// folders (Mount.Source is a path there), so that a conversation's
	// folder can be handed from one sandbox to another (the manager's
	// Recycle) and the executor's Unix sockets can be bind-mounted into
	// them (the egress proxy's).
	HostFolders bool
	// HostMemory: the sandboxes take the memory of the executor's host,
	// so that the pool of started sandboxes is bounded by what it has
	// available.
	HostMemory bool
}

// Spec is a sandbox to create. Whatever the engine, a sandbox is locked
// down: no network, no capability (but Runtime's own, for its agent), no
// new privileges, a read-only root filesystem, a private IPC namespace,
// no init of the engine's (the image's entrypoint, the agent, is PID 1),
// no log of its output kept, and Limits always set.
type Spec struct {
	// Name is unique among the engine's sandboxes; it holds only
	// [a-zA-Z0-9_.-].
	Name  string
	Image string
	// User is the uid:gid the image's entrypoint runs as (an engine's
	// runtime may run it apart, as root, and pass User on: see package
	// docker's Runtime).
	User    string
	WorkDir string
	Labels  map[string]string
	Limits  Limits
	Tmpfs   []Tmpfs
	Mounts  []Mount
}

// Limits bound a sandbox.
type Limits struct {
	Memory   int64 // bytes; swap is not allowed on top
	NanoCPUs int64
	Pids     int64
	// OpenFiles bounds each process's open files (RLIMIT_NOFILE).
	OpenFiles int64
	// FileSize bounds any one file a program writes (RLIMIT_FSIZE); 0 is
	// no bound.
	FileSize int64
}

// Tmpfs is a memory-backed folder of a sandbox, nosuid and nodev; its
// pages count against the sandbox's memory.
type Tmpfs struct {
	Target string
	Size   string // as tmpfs takes it: 64m
	// Exec lets programs execute files from it.
	Exec bool
	// Private makes it the sandbox User's, mode 0700.
	Private bool
}

// Mount gives a sandbox a folder: Source is the engine's name of it (for
// Docker, a folder of its host).
type Mount struct {
	Source, Target string
	ReadOnly       bool
}

// Attached is a created and started sandbox with its first process's
// standard streams attached.
type Attached struct {
	ID string
	// Stdin writes to the process's standard input.
	Stdin io.Writer
	// Stdout reads its standard output; what it writes to standard error
	// goes to the Stderr given to the engine's Create. Stdout ends, with
	// the streams' error, after Done is closed.
	Stdout io.Reader
	// Done is closed when the streams end: the sandbox stopped, or the
	// engine went away.
	Done <-chan struct{}
	// Closer ends the attachment (not the sandbox).
	Closer io.Closer
}

// Sandbox is one the engine lists.
type Sandbox struct {
	ID      string
	Labels  map[string]string
	Created time.Time
}

// State is what the engine knows of a sandbox's first process.
type State struct {
	Running   bool
	ExitCode  int
	OOMKilled bool
}

// Image is an image the engine has.
type Image struct {
	Tags   []string
	Labels map[string]string
}
