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
)

const (
	// TypeRun is the task that runs a program.
	TypeRun = "run"
	// Name is the queue runs wait in for any executor; each executor also
	// has a queue of its own (ExecutorQueue) for the conversations whose
	// sandbox it holds.
	Name = "runs"
	// Retention keeps finished tasks visible in the dashboard for a while.
	Retention = time.Hour
	// timeoutMargin is added to a run's own timeout for asynq's deadline,
	// which is only a backstop: the executor enforces the run's timeout.
	timeoutMargin = 2 * time.Minute
)

// Payload is what a run task carries: the run's id. What to run is in the
// run's record (the store's Spec), so the dashboard does not show users' code.
type Payload struct {
	RunID string `json:"run_id"`
}

// ExecutorQueue is the queue of runs for one executor.
func ExecutorQueue(executor string) string { return Name + "@" + executor }

// NewTask returns the task for a run that may take timeout, in queue q.
// The task id is the run id, so a run is never enqueued twice in a queue;
// it is never retried, so user code never runs twice.
func NewTask(runID string, timeout time.Duration, q string) (*asynq.Task, error) {
	b, err := json.Marshal(Payload{RunID: runID})
	if err != nil {
		return nil, fmt.Errorf("encode task: %w", err)
	}
	return asynq.NewTask(TypeRun, b,
		asynq.TaskID(runID),
		asynq.Queue(q),
		asynq.MaxRetry(0),
		asynq.Timeout(timeout.Truncate(time.Second)+timeoutMargin),
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
	c  *asynq.Client
	in *asynq.Inspector
}

// NewClient returns a client on conn, whose connections the process
// shares with the store (and, in an executor, asynq's server): one pool
// per process (see Conn). Closing conn is the caller's.
func NewClient(conn Conn) *Client {
	return &Client{c: asynq.NewClient(conn), in: asynq.NewInspector(conn)}
}

// Enqueue queues a run. A run whose task is already waiting or being
// handled is left as it is. A task of the run that asynq has finished
// with — archived after a failure between dequeue and claim (an executor
// killed, a Redis blip), or completed — is replaced: the run is still
// queued, and left so its conversation would wait forever. The store's
// claim keeps it from running twice, whatever happened to the old task.
// It reports whether it made a task.
func (c *Client) Enqueue(ctx context.Context, runID string, timeout time.Duration, q string) (bool, error) {
	t, err := NewTask(runID, timeout, q)
	if err != nil {
		return false, err
	}
	for range 2 {
		_, err = c.c.EnqueueContext(ctx, t)
		if !errors.Is(err, asynq.ErrTaskIDConflict) {
			break
		}
		info, ierr := c.in.GetTaskInfo(q, runID)
		if ierr != nil {
			if errors.Is(ierr, asynq.ErrTaskNotFound) {
				continue // gone since: enqueue again
			}
			return false, fmt.Errorf("enqueue run %s: inspect its task: %w", runID, ierr)
		}
		if info.State != asynq.TaskStateArchived && info.State != asynq.TaskStateCompleted {
			return false, nil // waiting or being handled
		}
		if derr := c.in.DeleteTask(q, runID); derr != nil && !errors.Is(derr, asynq.ErrTaskNotFound) {
			return false, fmt.Errorf("enqueue run %s: replace its finished task: %w", runID, derr)
		}
	}
	if errors.Is(err, asynq.ErrTaskIDConflict) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("enqueue run %s: %w", runID, err)
	}
	return true, nil
}

// Conn is the process's one pool of connections to Redis (the store's
// Conn), as asynq takes it: a connection option whose MakeRedisClient
// returns that pool's client, wrapped so that closing it does nothing.
// asynq's parts made from it (asynq.NewClient, NewServer, NewInspector,
// asynqmon) thus open no pool of their own, and closing or shutting them
// down leaves the process's open. asynq's constructors that take a shared
// client (NewClientFromRedisClient and its kin) name go-redis's type,
// which only the store imports; this option carries the client without
// naming it.
type Conn = asynq.RedisConnOpt

// Logger adapts slog to asynq's logger.
type Logger struct{ L *slog.Logger }

func (l Logger) Debug(args ...any) { l.L.Debug(fmt.Sprint(args...)) }
func (l Logger) Info(args ...any)  { l.L.Info(fmt.Sprint(args...)) }
func (l Logger) Warn(args ...any)  { l.L.Warn(fmt.Sprint(args...)) }
func (l Logger) Error(args ...any) { l.L.Error(fmt.Sprint(args...)) }
func (l Logger) Fatal(args ...any) { l.L.Error(fmt.Sprint(args...)) }
