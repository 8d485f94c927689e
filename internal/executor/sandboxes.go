package executor

import (
	"context"
	"net"
	"time"

	"github.com/runbox-dev/runbox"
	"github.com/runbox-dev/runbox/internal/files"
	"github.com/runbox-dev/runbox/internal/sandbox"
)

// The executor's two seams below it: the sandboxes it runs programs in
// (*sandbox.Manager, over whichever sandbox.Engine) and the workspace,
// the conversations' folders those sandboxes mount (*files.Folders, on
// this host). Each part of the executor names the slice it uses.

// Sandboxes is what the executor asks of its sandbox manager.
type Sandboxes interface {
	runSandboxes
	poolSandboxes
	janitorSandboxes
	peerSandboxes
	linkSandboxes
	// Discover finds the runners the engine's images offer.
	Discover(ctx context.Context) ([]runbox.Runner, error)
	CheckRuntime(ctx context.Context, image string) error
	Landlock() bool
	Templates() []runbox.Template
	// Conversations, Warm and Live count the conversations with a
	// sandbox here, the idle sandboxes and all of them.
	Conversations() int
	Warm() int
	Live() int
	// Drop removes the idle sandboxes of a closed conversation.
	Drop(conversation string) int
	// Pause saves the state of a conversation's idle kept interpreter and
	// lets its sandbox go (pause.go).
	Pause(conversation string) (sandbox.Paused, error)
	// PauseAll saves the state of every idle kept interpreter here and
	// lets their sandboxes go.
	PauseAll() error
	// Shutdown removes every sandbox of this executor.
	Shutdown(ctx context.Context) error
}

// runSandboxes is what a run asks of the sandboxes.
type runSandboxes interface {
	Run(ctx context.Context, req sandbox.Request, out sandbox.Output) (sandbox.Outcome, error)
	Hold(conversation string) (release func())
	HasSandbox(conversation string) bool
	Adopt(ctx context.Context, conversation, language string, adopt func(slot string) (string, error)) bool
}

// poolSandboxes is what the pool filler asks of them.
type poolSandboxes interface {
	Pooled(language string) int
	PoolTarget(language string, configured int) int
	// Reclaim returns how many of n sandboxes the pool lacks are coming
	// by recycling, reclaiming idle warm ones while new conversations
	// find the pool empty.
	Reclaim(language string, n int) int
	// StartsHeld reports that new conversations find the pool empty and
	// recycling serves them: no sandbox is to be started.
	StartsHeld(language string) bool
	Prestart(ctx context.Context, language, dataDir string) error
	// PoolWants is signalled when a new conversation asks for a sandbox.
	PoolWants() <-chan struct{}
}

// janitorSandboxes is what the sandbox janitor asks of them.
type janitorSandboxes interface {
	Prune() int
	Reap(ctx context.Context, minAge time.Duration) (int, error)
}

// peerSandboxes is what reaping a dead peer's sandboxes asks of them.
type peerSandboxes interface {
	Peers(ctx context.Context) ([]string, error)
	ReapDead(ctx context.Context, alive func(executor string) bool, minAge time.Duration) (map[string]int, error)
}

// linkSandboxes is what the api's link to this executor reaches.
type linkSandboxes interface {
	Sandboxes(conversation string) []string
	DialPort(ctx context.Context, conversation string, port int) (net.Conn, error)
}

// Workspace is what the executor asks of the conversations' folders that
// its sandboxes mount: Docker's bind them from this host, so the folders
// are paths of it (*files.Folders); an engine whose sandboxes are
// elsewhere needs a workspace of its own, with the same meaning.
type Workspace interface {
	runWorkspace
	slotWorkspace
	// Put and List are the link's upload and listing.
	Put(cid string, put []files.PutFile) error
	HardQuota() bool
	QuotaFallback() error
}

// runWorkspace is what a run asks of the folders.
type runWorkspace interface {
	Exists(cid string) bool
	// Ensure returns the conversation's folder, made if need be.
	Ensure(cid string) (string, error)
	// Adopt and MoveInto give a new conversation, or one without a
	// sandbox, a pooled sandbox's slot (files.Folders).
	Adopt(slot, cid string) (string, error)
	MoveInto(slot, cid string) (string, error)
	List(cid string) ([]files.Entry, error)
	Usage(cid string) (used, free int64, err error)
	Quota() int64
}

// slotWorkspace is what the pool and the peers' reaping ask of the
// folders: the empty ones pooled sandboxes mount.
type slotWorkspace interface {
	NewSlot(name string) (string, error)
	RemoveSlot(slot string) error
	RemoveSlots(prefix string) error
}

var (
	_ Sandboxes = (*sandbox.Manager)(nil)
	_ Workspace = (*files.Folders)(nil)
)
