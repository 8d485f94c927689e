package runbox

import (
	"strings"
	"time"
)

// MaxBatchRuns bounds the runs of one batch, MaxBatchBytes what they
// hold (the body of POST /v1/batches, and start_batch's runs).
const (
	MaxBatchRuns  = 1000
	MaxBatchBytes = 32 << 20
)

// Batch is where a batch of runs stands: how many runs it has, and how
// many are in each state. Runs that timed out or that the service could
// not run to their end count as failed.
type Batch struct {
	ID         string    `json:"batch_id"`
	Total      int       `json:"total"`
	Queued     int       `json:"queued"`
	Running    int       `json:"running"`
	Succeeded  int       `json:"succeeded"`
	Failed     int       `json:"failed"`
	Cancelled  int       `json:"cancelled"`
	CreatedAt  time.Time `json:"created_at"`
	FinishedAt time.Time `json:"finished_at,omitzero"`
}

// Done reports whether every run of the batch has ended.
func (b Batch) Done() bool { return b.Succeeded+b.Failed+b.Cancelled == b.Total }

// Webhook event types: what a webhook's body says happened.
const (
	WebhookRunStarted     = "run.started"
	WebhookRunCompleted   = "run.completed"
	WebhookBatchCompleted = "batch.completed"
)

// Webhook is a webhook's record.
type Webhook struct {
	ID      string
	Subject string // the run or batch it tells of
	Type    string // a Webhook… event type
	URL     string
	Client  string
	Created time.Time
	// Since is when its retries began (it was relayed, or asked for
	// again); zero before.
	Since    time.Time
	State    string
	Attempts int
}

// Webhook states.
const (
	WebhookPending   = "pending"   // not yet delivered: in the outbox or in the queue
	WebhookDelivered = "delivered" // the receiver answered 2xx
	WebhookFailed    = "failed"    // given up: out of time, or its URL is no longer allowed
	WebhookGone      = "gone"      // the receiver answered 410: not tried again
)

// Delivery is one attempt to deliver a webhook: when, what the receiver
// answered (StatusCode, 0 when it did not), how long it took, and what
// went wrong if it failed.
type Delivery struct {
	WebhookID  string    `json:"webhook_id"`
	Type       string    `json:"type"`
	Attempt    int       `json:"attempt"`
	At         time.Time `json:"at"`
	StatusCode int       `json:"status_code,omitempty"`
	DurationMS int64     `json:"duration_ms"`
	Error      string    `json:"error,omitempty"`
}

// BatchRecord is a batch's record.
type BatchRecord struct {
	Batch
	Client   string
	Callback string
	// Cancelling says that the batch was asked to stop: its waiting runs
	// are not let in.
	Cancelling bool
}

// ErrBatchNotFound reports a batch that does not exist (or has expired).
var ErrBatchNotFound = Errorf(ENotFound, "no such batch")

// NewBatch is a batch to record.
type NewBatch struct {
	ID        string
	Client    string
	CreatedAt time.Time
	Runs      []BatchRun
	// Callback is where the batch's end is told; "" nowhere.
	Callback string
	// IdempotencyKey, when the client used it before, returns that batch
	// instead of a new one.
	IdempotencyKey string
	// Bounds are what the client may have waiting and spend (see
	// NewRun); MaxWaiting bounds the runs waiting per conversation, as
	// for runs submitted alone.
	Bounds     ClientBounds
	MaxWaiting int
	Queue      TaskQueue
}

// BatchRun is a run of a new batch.
type BatchRun struct {
	// Run is its record: ID, ConversationID (a conversation key),
	// Language, Interactive.
	Run  Run
	Spec Spec
	// Task is its task as asynq stores it (queue.Scheduler.StoredTask).
	Task     []byte
	Callback Callback
}

// TaskQueue is where asynq keeps the tasks of a queue (queue.Scheduler.SharedQueue):
// the store writes a batch's tasks there itself, in the script that
// records the batch.
type TaskQueue struct {
	Name          string
	TaskKeyPrefix string // a task's hash is this and its id
	PendingKey    string
	QueuesKey     string // the set of queue names
}

// ErrWebhookNotFound reports a webhook that does not exist, or expired.
var ErrWebhookNotFound = Errorf(ENotFound, "no such webhook")

// WebhookID is the id of the webhook that tells of event (a
// Webhook… type) of subject, a run or a batch: the same whoever
// writes it and on every attempt, as receivers deduplicate by it.
func WebhookID(subject, event string) string {
	_, kind, _ := strings.Cut(event, ".")
	return "msg_" + subject + "_" + kind
}

// Callback is where a run's end is told, and its start when Started.
type Callback struct {
	URL     string
	Started bool
}
