package queue

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/runbox-dev/runbox"
	"github.com/runbox-dev/runbox/internal/store"
)

// Only a conversation's head is in the queue; the runs behind it wait in
// Redis (see store.CreateRun). The Scheduler enqueues a run when it comes
// to head its conversation, and Sweep repairs what a crash between "the
// head ended" and "the next was enqueued" would leave.

// sweepAge is how old a queued head must be before Sweep enqueues it
// itself: younger ones are being enqueued by whoever admitted them.
const sweepAge = 2 * time.Second

// Scheduler enqueues runs when their turn comes.
type Scheduler struct {
	store *store.Store
	queue *Client
	log   *slog.Logger
}

// NewScheduler returns a Scheduler.
func NewScheduler(st *store.Store, q *Client, log *slog.Logger) *Scheduler {
	return &Scheduler{store: st, queue: q, log: log}
}

// Enqueue queues a run that heads its conversation. An empty id is
// nothing to do.
func (s *Scheduler) Enqueue(ctx context.Context, id string) error {
	if id == "" {
		return nil
	}
	spec, err := s.store.Spec(ctx, id)
	if err != nil {
		return err
	}
	// A conversation's runs go to the executor that holds its sandbox
	// (and kept interpreter) while it lives; to any executor otherwise. A
	// run stranded in the queue of an executor that died is enqueued again
	// by Sweep, then in the shared queue.
	owner, err := s.store.Owner(ctx, spec.ConversationID)
	if err != nil {
		return err
	}
	q := Name
	if owner != "" {
		q = ExecutorQueue(owner)
	}
	made, err := s.queue.Enqueue(ctx, id, spec.Timeout(), q)
	if err != nil || !made {
		return err
	}
	// An idle executor takes it now rather than at its next poll; if the
	// announcement is lost, the poll still finds the task.
	if err := s.store.Wake(ctx, id, owner); err != nil {
		s.log.Warn("announce a run", "run", id, "err", err)
	}
	return nil
}

// Sweep moves on every conversation whose head has ended, and enqueues
// heads that were never enqueued.
func (s *Scheduler) Sweep(ctx context.Context) {
	heads, err := s.store.Heads(ctx)
	if err != nil {
		s.log.Warn("sweep conversations", "err", err)
		return
	}
	for _, h := range heads {
		if err := s.sweep(ctx, h); err != nil {
			s.log.Warn("sweep conversation", "conversation", h.Conversation, "run", h.Run, "err", err)
		}
	}
}

func (s *Scheduler) sweep(ctx context.Context, h store.Head) error {
	run, err := s.store.Run(ctx, h.Run)
	switch {
	case errors.Is(err, store.ErrNotFound):
	case err != nil:
		return err
	case run.Status == runbox.StatusQueued:
		if time.Since(run.CreatedAt) < sweepAge {
			return nil
		}
		return s.Enqueue(ctx, h.Run)
	case !run.Status.Final():
		return nil // running: its executor or the watchdog will end it
	}
	next, err := s.store.Advance(ctx, h)
	if err != nil {
		return err
	}
	if next != "" {
		s.log.Info("conversation moved on past an ended run", "conversation", h.Conversation, "ended", h.Run, "next", next)
	}
	if err := s.Enqueue(ctx, next); err != nil {
		return fmt.Errorf("enqueue %s: %w", next, err)
	}
	return nil
}
