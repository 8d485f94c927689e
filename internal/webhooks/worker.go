package webhooks

import (
	"context"
	"fmt"
	"time"

	"github.com/hibiken/asynq"

	"github.com/runbox-dev/runbox/internal/queue"
	"github.com/runbox-dev/runbox/internal/store"
)

const (
	// Concurrency is how many webhooks one api delivers at once: each
	// mostly waits for its receiver.
	Concurrency = 16
	// pollInterval is how often an idle worker asks asynq for webhooks:
	// a webhook waits that long at most once relayed.
	pollInterval = 250 * time.Millisecond
	// shutdownWait is how long deliveries under way may finish when the
	// api stops; asynq then puts the rest back, to be delivered again.
	shutdownWait = 5 * time.Second
)

// Worker delivers the webhooks of asynq's queue Queue: an asynq server of
// its own in the api, whose tasks are the dashboard's to show.
type Worker struct {
	s   *Service
	srv *asynq.Server
}

// NewWorker returns a Worker for s on conn, the process's connection.
func NewWorker(conn *store.Conn, s *Service) *Worker {
	return &Worker{s: s, srv: asynq.NewServerFromRedisClient(conn.Redis(), asynq.Config{
		Concurrency:       Concurrency,
		Queues:            map[string]int{Queue: 1},
		RetryDelayFunc:    s.RetryDelay,
		TaskCheckInterval: pollInterval,
		// Retries are due at times of their own: looked for every second.
		DelayedTaskCheckInterval: time.Second,
		ShutdownTimeout:          shutdownWait,
		Logger:                   queue.Logger{L: s.log.With("component", "asynq")},
		LogLevel:                 asynq.WarnLevel,
	})}
}

// Start starts delivering.
func (w *Worker) Start(context.Context) error {
	mux := asynq.NewServeMux()
	mux.HandleFunc(TypeDeliver, w.s.ProcessTask)
	if err := w.srv.Start(mux); err != nil {
		return fmt.Errorf("start the webhooks' worker: %w", err)
	}
	return nil
}

// Stop stops taking webhooks and waits for those under way (at most
// shutdownWait).
func (w *Worker) Stop() { w.srv.Shutdown() }
