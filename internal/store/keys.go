package store

import "github.com/runbox-dev/runbox/internal/store/internal/keys"

// Key names. A run's keys (those of package keys, and these) share a hash
// tag so that its scripts touch one slot.
const prefix = keys.Prefix

func stdinKey(id string) string { return prefix + "run:{" + id + "}:stdin" }
func stdinBytesKey(id string) string {
	return prefix + "run:{" + id + "}:stdin:bytes"
}
func executorKey(id string) string { return prefix + "executor:" + id }

// An executor that is shutting down: it owns no conversation any more
// (owner.go), though its heartbeat goes on until its runs have ended.
func drainingKey(id string) string { return prefix + "draining:" + id }

// A conversation's runs, its head (the one run enqueued or running) and
// the runs waiting behind it.
func conversationRunsKey(cid string) string    { return prefix + "conv:" + cid + ":runs" }
func conversationHeadKey(cid string) string    { return prefix + "conv:" + cid + ":head" }
func conversationPendingKey(cid string) string { return prefix + "conv:" + cid + ":pending" }

// A conversation's live runs (claimed and not ended, detached ones
// included) and the executor they run on (claimScript).
func conversationLiveKey(cid string) string { return prefix + "conv:" + cid + ":live" }

func idempotencyKey(client, key string) string { return prefix + "idem:" + client + ":" + key }

// A client's recent runs, for list_runs without a conversation.
func clientRunsKey(client string) string { return prefix + "client:" + client + ":runs" }

const (
	deploymentKey   = prefix + "deployment" // the id every executor on this Redis labels its containers with
	leasesKey       = prefix + "leases"
	executorsKey    = prefix + "executors"
	busyConvsKey    = prefix + "convs:busy" // conversations with a head
	parallelKey     = prefix + "parallel"   // parallel runs not yet claimed, by creation time
	cancelChannel   = prefix + "cancel"     // run ids whose cancellation was asked for
	closedChannel   = prefix + "closed"     // ids of closed conversations
	wakeKey         = prefix + "wake"       // runs just enqueued, for an idle executor (wake.go)
	cancelFlagField = "cancel"
	specField       = "spec"
)

// A conversation whose kept interpreter has run cells.
func keptStateKey(cid string) string { return prefix + "conv:" + cid + ":kept" }

// The executor that holds a conversation's sandbox (owner.go).
func ownerKey(cid string) string { return prefix + "conv:" + cid + ":owner" }

// Announcements of runs for one executor (wake.go).
func wakeExecutorKey(executor string) string { return wakeKey + ":" + executor }

// Conversations' files in a shared file store (files.go): the version of
// each, the clock versions are taken from, and when each was last used.
func filesVersionKey(cid string) string { return prefix + "conv:" + cid + ":files" }

const (
	filesClockKey = prefix + "files:clock"
	filesUsedKey  = prefix + "files:used"
	fileSecretKey = prefix + "file-secret"
	leaderKey     = prefix + "leader" // the process that does the maintenance (leader.go)
)

// A preview URL's record (preview.go).
func previewKey(id string) string { return prefix + "preview:" + id }

// A project (create_sandbox_for_project) by its conversation's key, and
// every project by when it expires (projects.go).
func projectKey(cid string) string { return prefix + "project:" + cid }

const projectsKey = prefix + "projects"

// The client that made a branch of a git repository through the git
// tools (git.go). repo is the repository as gitexport names it; a branch
// holds no ':', so no two pairs share a key.
func branchOwnerKey(repo, branch string) string { return prefix + "git:" + repo + ":branch:" + branch }
