// Package queue is the job queue between api and executors, on asynq: the
// run task, how it is enqueued, and the settings both ends share.
package queue

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/hibiken/asynq"

	"github.com/runbox-dev/runbox"
)

const (
	// TypeRun is the task that runs a program.
	TypeRun = "run"
	// Name is the queue runs wait in.
	Name = "runs"
	// Retention keeps finished tasks visible in the dashboard for a while.
	Retention = time.Hour
	// timeoutMargin is added to a run's own timeout for asynq's deadline,
	// which is only a backstop: the executor enforces the run's timeout.
	timeoutMargin = 2 * time.Minute
)

// Payload is what a run task carries.
type Payload struct {
	RunID string      `json:"run_id"`
	Spec  runbox.Spec `json:"spec"`
}

// NewTask returns the task for a run. The task id is the run id, so a run
// is never enqueued twice; it is never retried, so user code never runs
// twice.
func NewTask(runID string, spec runbox.Spec) (*asynq.Task, error) {
	b, err := json.Marshal(Payload{RunID: runID, Spec: spec})
	if err != nil {
		return nil, fmt.Errorf("encode task: %w", err)
	}
	return asynq.NewTask(TypeRun, b,
		asynq.TaskID(runID),
		asynq.Queue(Name),
		asynq.MaxRetry(0),
		asynq.Timeout(spec.Timeout().Truncate(time.Second)+timeoutMargin),
		asynq.Retention(Retention),
	), nil
}

// Decode reads a run task's payload.
func Decode(t *asynq.Task) (Payload, error) {
	var p Payload
	if err := json.Unmarshal(t.Payload(), &p); err != nil {
		return p, fmt.Errorf("decode task: %w", err)
	}
	if p.RunID == "" {
		return p, errors.New("decode task: no run id")
	}
	return p, nil
}

// Client enqueues runs.
type Client struct {
	c *asynq.Client
}

// NewClient returns a client on the Redis at opt.
func NewClient(opt asynq.RedisConnOpt) *Client { return &Client{c: asynq.NewClient(opt)} }

// Close closes the client's connection.
func (c *Client) Close() error { return c.c.Close() }

// Enqueue queues a run.
func (c *Client) Enqueue(ctx context.Context, runID string, spec runbox.Spec) error {
	t, err := NewTask(runID, spec)
	if err != nil {
		return err
	}
	if _, err := c.c.EnqueueContext(ctx, t); err != nil {
		return fmt.Errorf("enqueue run %s: %w", runID, err)
	}
	return nil
}

// RedisOpt parses a redis:// URL for asynq.
func RedisOpt(url string) (asynq.RedisConnOpt, error) {
	opt, err := asynq.ParseRedisURI(url)
	if err != nil {
		return nil, fmt.Errorf("parse REDIS_URL: %w", err)
	}
	return opt, nil
}

// Logger adapts slog to asynq's logger.
type Logger struct{ L *slog.Logger }

func (l Logger) Debug(args ...any) { l.L.Debug(fmt.Sprint(args...)) }
func (l Logger) Info(args ...any)  { l.L.Info(fmt.Sprint(args...)) }
func (l Logger) Warn(args ...any)  { l.L.Warn(fmt.Sprint(args...)) }
func (l Logger) Error(args ...any) { l.L.Error(fmt.Sprint(args...)) }
func (l Logger) Fatal(args ...any) { l.L.Error(fmt.Sprint(args...)) }
