package runbox

import (
	"errors"
	"time"
)

// The records below are those of a run's path through the store (package
// store's Runs): how a run is admitted to its conversation's queue,
// claimed, and ended. They live here so that the store's consumers name
// them without importing the store.

// ErrRunNotFound reports a run that does not exist (or has expired).
var ErrRunNotFound = Errorf(ENotFound, "no such run")

// ErrBusy reports a conversation with too many runs waiting.
var ErrBusy = Errorf(EBusy, "too many runs are waiting in this conversation; try again when some have finished")

// NewRun is a run to record.
type NewRun struct {
	Run  Run
	Spec Spec
	// Client owns the run. With IdempotencyKey, a retried submission
	// returns the first run instead of a new one.
	Client         string
	IdempotencyKey string
	// MaxWaiting bounds the runs waiting per conversation.
	MaxWaiting int
	// Parallel runs neither wait in nor hold their conversation's order:
	// they are enqueued at once (AdmitEnqueue), whatever else the
	// conversation runs.
	Parallel bool
	// Callback is where the run's end (and start, if asked) is told;
	// zero: nowhere.
	Callback Callback
	// Bounds are what its client may have waiting and spend: with
	// RunSecondsPerDay, the run holds its timeout of the client's day
	// from its record to its end.
	Bounds ClientBounds
}

// ClientBounds are what a client may have waiting and spend, held by the
// store as it records the client's runs: past one, a run (or a whole
// batch) is refused before anything is written. Zero is no bound.
type ClientBounds struct {
	// MaxQueuedRuns and MaxQueuedBytes bound the client's runs recorded and
	// not yet started, and the bytes they hold in Redis.
	MaxQueuedRuns  int
	MaxQueuedBytes int64
	// ConcurrentRuns bounds the client's runs given to executors at once
	// (its tier's concurrent_runs): its other runs wait their turn.
	ConcurrentRuns int
	// RunSecondsPerDay bounds the seconds its runs take in a day (UTC),
	// each run's timeout reserved from its record to its end.
	RunSecondsPerDay int
}

// Admission says what became of a new run.
type Admission int

const (
	// AdmitEnqueue: the run heads its conversation; enqueue it now.
	AdmitEnqueue Admission = iota + 1
	// AdmitWait: it waits behind its conversation's head, and is enqueued
	// when its turn comes (Finish returns it as next).
	AdmitWait
	// AdmitExists: the idempotency key was used before; the run is that
	// one.
	AdmitExists
	// AdmitReady: it heads its conversation, and waits for its client's
	// turn (its runs given to executors and not yet started are at their
	// bound); a claim or an end of one of them lets it go.
	AdmitReady
)

// ConversationHead is a conversation and the run that heads it.
type ConversationHead struct {
	Conversation string
	Run          string
}

// StaleHead is a conversation's head the sweep must act on: its run ended
// without its conversation moving on (Ended: the sweep advances it), or
// it was given to the executors a while ago and its enqueueing may have
// been lost (the sweep enqueues it again).
type StaleHead struct {
	ConversationHead
	Ended bool
}

// Claimed is the outcome of a claim (store's ClaimFor).
type Claimed struct {
	// OK: the run is this executor's to run now.
	OK bool
	// Elsewhere, when not OK, is the executor that runs the run's
	// conversation's live runs: the run must go there.
	Elsewhere string
	// Status, when neither, is the status of a run that was not queued;
	// "" when there is no such run.
	Status Status
	// Spec is what the run was asked to do (when OK or Elsewhere): the
	// claim's reply carries it, so that the executor need not read it.
	Spec Spec
	// Dispatch are runs of the same client the claim let go: they head
	// their conversations and are to be enqueued.
	Dispatch []string
}

// LeaseOp says what a transition does to the run's lease.
type LeaseOp int

const (
	LeaseKeep LeaseOp = iota
	LeaseSet
	LeaseDelete
	LeaseExpired // only if the lease has run out; then delete it
)

// Ending is how a run ends, for Finish.
type Ending struct {
	From         []Status // statuses it may end from
	Lease        LeaseOp
	Status       Status
	Result       *Result
	Events       []Event // logged before done
	Conversation string
}

// Applied is the outcome of a transition.
type Applied struct {
	// Done is false when the run was not in a status of From (or, for
	// LeaseExpired, its lease was still current): then nothing changed.
	Done bool
	// Status is the run's status when nothing changed.
	Status Status
	// Dispatch are the runs to enqueue now: the one that now heads the
	// conversation, if its client's turn allows, and those of its client
	// the end let go.
	Dispatch []string
}

// CancelRequest is a client's cancellation of a run: kill it, or ask its
// program to stop first (Graceful).
type CancelRequest struct {
	ID       string
	Graceful bool
}

// MaxQueuedStdin bounds the input queued for a run and not yet read by its
// program (a run still waiting in its queue reads none): what a client can
// make Redis hold through one run's input.
const MaxQueuedStdin = 1 << 20

// ErrInputFull reports a run whose queued input is not being read.
var ErrInputFull = errors.New("the program's input queue is full")

// ExecutorInfo is what an executor announces about itself.
type ExecutorInfo struct {
	ID          string    `json:"id"`
	Concurrency int       `json:"concurrency"`
	Runners     []Runner  `json:"runners"`
	StartedAt   time.Time `json:"started_at"`
	// Templates are the project templates it offers (images labelled
	// sandbox.template).
	Templates []Template `json:"templates,omitempty"`
	// Addr is where the api reaches its sandboxes (package link):
	// host:port.
	Addr string `json:"addr,omitempty"`
	// Landlock says that its sandboxes hold programs to filesystem rules
	// (Filesystem).
	Landlock bool `json:"landlock,omitempty"`
	// Conversations counts the conversations it holds a sandbox of.
	Conversations int `json:"conversations,omitempty"`
}

// ErrExecutorGone reports an executor whose heartbeat lapsed.
var ErrExecutorGone = errors.New("store: executor is gone")
