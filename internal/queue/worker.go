package queue

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/hibiken/asynq"
)

// Worker hands one executor the run tasks of its own queue
// (ExecutorQueue) and of the shared one: asynq's server, on the process's
// connection.
type Worker struct {
	conn     Conn
	executor string
	log      *slog.Logger
	srv      *asynq.Server
}

// NewWorker returns a Worker for executor on conn, the process's
// connection (closed by the caller); log is the executor's.
func NewWorker(conn Conn, executor string, log *slog.Logger) *Worker {
	return &Worker{conn: conn, executor: executor, log: log}
}

// Start hands handle the runs of the executor's queues, by id,
// concurrency at once, asking for them every poll when idle. A task that
// is not a run's is dropped, never retried.
func (w *Worker) Start(concurrency int, poll time.Duration, handle func(ctx context.Context, runID string) error) error {
	w.srv = asynq.NewServer(w.conn, asynq.Config{
		Concurrency: concurrency,
		// Its own queue (the conversations whose sandbox it holds) more
		// often than the shared one, never only: new conversations must
		// not wait while owned ones keep coming.
		Queues:            map[string]int{ExecutorQueue(w.executor): 2, Name: 1},
		TaskCheckInterval: poll,
		// The executor's own shutdown ends every run before asynq's; this
		// is a backstop.
		ShutdownTimeout: 10 * time.Second,
		Logger:          Logger{L: w.log.With("component", "asynq")},
		LogLevel:        asynq.WarnLevel,
	})
	mux := asynq.NewServeMux()
	mux.HandleFunc(TypeRun, func(ctx context.Context, t *asynq.Task) error {
		p, err := Decode(t)
		if err != nil {
			return fmt.Errorf("%w: %w", err, asynq.SkipRetry)
		}
		return handle(ctx, p.RunID)
	})
	if err := w.srv.Start(mux); err != nil {
		return fmt.Errorf("start worker: %w", err)
	}
	return nil
}

// Stop stops taking tasks; those being handled go on.
func (w *Worker) Stop() { w.srv.Stop() }

// Shutdown waits for the tasks being handled (at most a backstop's
// while) and stops the server.
func (w *Worker) Shutdown() { w.srv.Shutdown() }

// RemoveQueue removes the executor's own queue from asynq (and so from
// the dashboard) when nothing waits in it; what does is enqueued again
// for any executor by the sweep once this one is gone.
func (w *Worker) RemoveQueue() {
	in := asynq.NewInspector(w.conn) // shares the process's connection: never closed
	err := in.DeleteQueue(ExecutorQueue(w.executor), false)
	if err != nil && !errors.Is(err, asynq.ErrQueueNotFound) {
		w.log.Info("keep the executor's queue", "err", err)
	}
}
