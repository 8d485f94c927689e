package queue

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/hibiken/asynq"
)

// Webhooks wait in a queue of their own, each a task whose id is the
// webhook's (internal/webhooks).
const (
	// WebhookQueue is asynq's queue of webhooks; TypeWebhook its tasks'
	// type.
	WebhookQueue = "webhooks"
	TypeWebhook  = "webhook"
	// WebhookConcurrency is how many webhooks one api delivers at once:
	// each mostly waits for its receiver.
	WebhookConcurrency = 16
	// webhookRetries is asynq's bound, beyond any WEBHOOK_RETRY_FOR: the
	// handler gives up when the webhook's time is out.
	webhookRetries = 10000
	// webhookTimeout is asynq's deadline for one attempt, a backstop: the
	// attempt itself is bounded by webhooks.Options.AttemptTimeout.
	webhookTimeout = time.Minute
	// webhookPoll is how often an idle worker asks asynq for webhooks: a
	// webhook waits that long at most once relayed.
	webhookPoll = 250 * time.Millisecond
	// webhookShutdownWait is how long deliveries under way may finish
	// when the api stops; asynq then puts the rest back, to be delivered
	// again.
	webhookShutdownWait = 5 * time.Second
)

// webhookPayload is a webhook task's: the webhook's id.
type webhookPayload struct {
	ID string `json:"webhook_id"`
}

// Webhooks makes the webhooks' tasks.
type Webhooks struct {
	client    *asynq.Client
	inspector *asynq.Inspector
}

// NewWebhooks returns Webhooks on conn, the process's connection (closed
// by the caller).
func NewWebhooks(conn Conn) *Webhooks {
	return &Webhooks{client: asynq.NewClient(conn), inspector: asynq.NewInspector(conn)}
}

// Enqueue makes webhook id's task, once: asynq refuses a second task of
// the same id while the first exists (completed ones are kept an hour).
// It reports whether it made one.
func (q *Webhooks) Enqueue(ctx context.Context, id string) (bool, error) {
	b, err := json.Marshal(webhookPayload{ID: id})
	if err != nil {
		return false, err
	}
	_, err = q.client.EnqueueContext(ctx, asynq.NewTask(TypeWebhook, b,
		asynq.TaskID(id), asynq.Queue(WebhookQueue), asynq.MaxRetry(webhookRetries),
		asynq.Timeout(webhookTimeout), asynq.Retention(time.Hour)))
	if errors.Is(err, asynq.ErrTaskIDConflict) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("enqueue webhook %s: %w", id, err)
	}
	return true, nil
}

// Requeue makes webhook id's task pending: a new task when asynq has none
// or is done with it. One that waits — for its retry's back-off, or
// deferred by the handler (a busy client, a failing receiver) — is left
// to come at its time: asking for a delivery again does not skip a
// back-off, so that a loop of such requests cannot make a failing
// receiver's attempts hold the workers.
func (q *Webhooks) Requeue(ctx context.Context, id string) error {
	info, err := q.inspector.GetTaskInfo(WebhookQueue, id)
	switch {
	case errors.Is(err, asynq.ErrTaskNotFound) || errors.Is(err, asynq.ErrQueueNotFound):
	case err != nil:
		return fmt.Errorf("redeliver webhook %s: %w", id, err)
	case info.State == asynq.TaskStateArchived || info.State == asynq.TaskStateCompleted:
		if err := q.inspector.DeleteTask(WebhookQueue, id); err != nil && !errors.Is(err, asynq.ErrTaskNotFound) {
			return fmt.Errorf("redeliver webhook %s: %w", id, err)
		}
	default:
		return nil // waiting, or being delivered
	}
	_, err = q.Enqueue(ctx, id)
	return err
}

// WebhookHandler delivers the webhooks a WebhookWorker hands it
// (*webhooks.Service).
type WebhookHandler interface {
	// Deliver makes one attempt to deliver webhook id, retried times
	// retried before. An error is retried after RetryDelay, unless it is
	// final: the task is then archived. An error with a method
	// Defer() time.Duration (webhooks.Deferred) is a webhook not
	// attempted: handed back for that long, not counted as a retry.
	Deliver(ctx context.Context, id string, retried int) (final bool, err error)
	// RetryDelay is the wait before attempt n+1 of webhook id.
	RetryDelay(id string, n int) time.Duration
}

// WebhookWorker delivers the webhooks of WebhookQueue: an asynq server of
// its own in the api, whose tasks are the dashboard's to show.
type WebhookWorker struct {
	h   WebhookHandler
	srv *asynq.Server
}

// NewWebhookWorker returns a WebhookWorker for h on conn, the process's
// connection; log is the webhooks'.
func NewWebhookWorker(conn Conn, h WebhookHandler, log *slog.Logger) *WebhookWorker {
	return &WebhookWorker{h: h, srv: asynq.NewServer(conn, asynq.Config{
		Concurrency: WebhookConcurrency,
		Queues:      map[string]int{WebhookQueue: 1},
		// A deferral is no failure: asynq neither counts it as a retry
		// nor as failed.
		IsFailure: func(err error) bool {
			_, deferred := deferredFor(err)
			return !deferred
		},
		RetryDelayFunc: func(n int, err error, t *asynq.Task) time.Duration {
			if d, ok := deferredFor(err); ok {
				return d
			}
			var p webhookPayload
			_ = json.Unmarshal(t.Payload(), &p)
			return h.RetryDelay(p.ID, n)
		},
		TaskCheckInterval: webhookPoll,
		// Retries are due at times of their own: looked for every second.
		DelayedTaskCheckInterval: time.Second,
		ShutdownTimeout:          webhookShutdownWait,
		Logger:                   Logger{L: log.With("component", "asynq")},
		LogLevel:                 asynq.WarnLevel,
	})}
}

// Start starts delivering.
func (w *WebhookWorker) Start(context.Context) error {
	mux := asynq.NewServeMux()
	mux.HandleFunc(TypeWebhook, w.process)
	if err := w.srv.Start(mux); err != nil {
		return fmt.Errorf("start the webhooks' worker: %w", err)
	}
	return nil
}

// Stop stops taking webhooks and waits for those under way (at most
// webhookShutdownWait).
func (w *WebhookWorker) Stop() { w.srv.Shutdown() }

// deferredFor says how long a webhook the handler did not attempt waits.
func deferredFor(err error) (time.Duration, bool) {
	var d interface{ Defer() time.Duration }
	if errors.As(err, &d) {
		return d.Defer(), true
	}
	return 0, false
}

// process hands one task to the handler; a final error is not retried.
func (w *WebhookWorker) process(ctx context.Context, t *asynq.Task) error {
	var p webhookPayload
	if err := json.Unmarshal(t.Payload(), &p); err != nil || p.ID == "" {
		return fmt.Errorf("decode webhook task: %w", asynq.SkipRetry)
	}
	retried, _ := asynq.GetRetryCount(ctx)
	final, err := w.h.Deliver(ctx, p.ID, retried)
	if err != nil && final {
		return fmt.Errorf("%w: %w", err, asynq.SkipRetry)
	}
	return err
}
