package runbox

import "time"

// MaxBatchRuns bounds the runs of one batch.
const MaxBatchRuns = 1000

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
