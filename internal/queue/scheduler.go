package queue

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/runbox-dev/runbox"
)

// Only a conversation's head is in the queue; the runs behind it wait in
// Redis (see store.Runs.CreateRun). The Scheduler enqueues a run when it comes
// to head its conversation, and Sweep repairs what a crash between "the
// head ended" and "the next was enqueued" would leave.

// sweepAge is how old a queued head must be before Sweep enqueues it
// itself: younger ones are being enqueued by whoever admitted them.
const sweepAge = 2 * time.Second

// Runs is what the Scheduler reads and moves of runs and of their
// conversations' queues (the store's Runs).
type Runs interface {
	// Spec is what run id was asked to do.
	Spec(ctx context.Context, id string) (runbox.Spec, error)
	// Owner is the executor that holds conversation cid's sandbox, or "".
	Owner(ctx context.Context, cid string) (string, error)
	// Wake announces run id, just enqueued, to an idle executor (executor
	// first, when not "").
	Wake(ctx context.Context, id, executor string) error
	// Reconcile mends the clients' counts of runs waiting and reserved
	// that a crash left (full: every run waiting, else those given to
	// asynq), and returns the heads whose clients' turn came, to enqueue.
	Reconcile(ctx context.Context, full bool) ([]string, error)
	// StaleHeads lists the conversations' heads that ended without their
	// conversation moving on, and those given to the executors before
	// cutoff and still queued.
	StaleHeads(ctx context.Context, cutoff time.Time) ([]runbox.StaleHead, error)
	// Advance moves a conversation past its head, which ended, and
	// returns the run that heads it now.
	Advance(ctx context.Context, h runbox.ConversationHead) (string, error)
	// StaleParallel lists parallel runs made before cutoff and not yet
	// claimed, up to n; ForgetParallel drops some of them.
	StaleParallel(ctx context.Context, cutoff time.Time, n int) ([]string, error)
	ForgetParallel(ctx context.Context, ids ...string) error
	Run(ctx context.Context, id string) (runbox.Run, error)
}

// Scheduler enqueues runs when their turn comes.
type Scheduler struct {
	runs  Runs
	queue *Client
	log   *slog.Logger
	// sweeps counts Sweep's calls: every fullEvery-th reconciles every
	// run waiting.
	sweeps int
}

// fullEvery is how many sweeps pass between two that look at every run
// waiting (the others look at those given to asynq): a crash leaves a
// client's count of waiting runs one too high for at most that long.
const fullEvery = 30

// NewScheduler returns a Scheduler.
func NewScheduler(st Runs, q *Client, log *slog.Logger) *Scheduler {
	return &Scheduler{runs: st, queue: q, log: log}
}

// Enqueue queues runs that head their conversations and whose clients'
// turn came (runbox.Applied.Dispatch, runbox.Claimed.Dispatch). It goes
// on past a run it could not enqueue, and returns the first error: the
// sweep enqueues those.
func (s *Scheduler) Enqueue(ctx context.Context, ids ...string) error {
	var first error
	for _, id := range ids {
		spec, err := s.runs.Spec(ctx, id)
		if err == nil {
			err = s.EnqueueSpec(ctx, id, spec)
		}
		if err != nil && first == nil {
			first = fmt.Errorf("enqueue %s: %w", id, err)
		}
	}
	return first
}

// EnqueueSpec queues a run that heads its conversation, as Enqueue does,
// for a caller that has its spec (it made the run).
func (s *Scheduler) EnqueueSpec(ctx context.Context, id string, spec runbox.Spec) error {
	owner, err := s.runs.Owner(ctx, spec.ConversationID)
	if err != nil {
		return err
	}
	return s.enqueue(ctx, id, spec, owner)
}

// EnqueueFor queues a run for executor, which runs its conversation's
// live runs (runbox.Claimed.Elsewhere); spec is the run's, from the claim.
func (s *Scheduler) EnqueueFor(ctx context.Context, id string, spec runbox.Spec, executor string) error {
	return s.enqueue(ctx, id, spec, executor)
}

// enqueue queues a run for owner, or for any executor when owner is "". A
// conversation's runs go to the executor that holds its sandbox (and kept
// interpreter) while it lives; to any executor otherwise. A run stranded
// in the queue of an executor that died is enqueued again by Sweep, then
// in the shared queue.
func (s *Scheduler) enqueue(ctx context.Context, id string, spec runbox.Spec, owner string) error {
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
	if err := s.runs.Wake(ctx, id, owner); err != nil {
		s.log.Warn("announce a run", "run", id, "err", err)
	}
	return nil
}

// Sweep mends the clients' counts and enqueues the heads whose clients'
// turn came (a process that ended or claimed a run may have died before
// it enqueued them), moves on every conversation whose head has ended, and
// enqueues heads and parallel runs that were never enqueued.
func (s *Scheduler) Sweep(ctx context.Context) {
	s.sweeps++
	ids, err := s.runs.Reconcile(ctx, s.sweeps%fullEvery == 1)
	if err != nil {
		s.log.Warn("reconcile the clients' queues", "err", err)
	}
	if len(ids) > 0 {
		s.log.Debug("runs let go by the sweep", "runs", len(ids))
	}
	if err := s.Enqueue(ctx, ids...); err != nil {
		s.log.Warn("enqueue the runs the sweep let go", "err", err)
	}
	heads, err := s.runs.StaleHeads(ctx, time.Now().Add(-sweepAge))
	if err != nil {
		s.log.Warn("sweep conversations", "err", err)
		return
	}
	for _, h := range heads {
		if err := s.sweep(ctx, h); err != nil {
			s.log.Warn("sweep conversation", "conversation", h.Conversation, "run", h.Run, "err", err)
		}
	}
	s.sweepParallel(ctx)
}

// sweepBatch bounds the parallel runs one sweep looks at.
const sweepBatch = 200

// sweepParallel enqueues (again) the parallel runs still queued a while
// after they were made — enqueueing one that is waiting in a queue does
// nothing — and forgets those that are not queued any more.
func (s *Scheduler) sweepParallel(ctx context.Context) {
	ids, err := s.runs.StaleParallel(ctx, time.Now().Add(-sweepAge), sweepBatch)
	if err != nil {
		s.log.Warn("sweep parallel runs", "err", err)
		return
	}
	var gone []string
	for _, id := range ids {
		run, err := s.runs.Run(ctx, id)
		switch {
		case errors.Is(err, runbox.ErrRunNotFound) || err == nil && run.Status != runbox.StatusQueued:
			gone = append(gone, id)
		case err != nil:
			s.log.Warn("sweep parallel run", "run", id, "err", err)
		default:
			if err := s.Enqueue(ctx, id); err != nil {
				s.log.Warn("sweep parallel run", "run", id, "err", err)
			}
		}
	}
	if err := s.runs.ForgetParallel(ctx, gone...); err != nil {
		s.log.Warn("sweep parallel runs", "err", err)
	}
}

// sweep enqueues a head again, or moves its conversation past it when it
// ended.
func (s *Scheduler) sweep(ctx context.Context, h runbox.StaleHead) error {
	if !h.Ended {
		return s.Enqueue(ctx, h.Run)
	}
	next, err := s.runs.Advance(ctx, h.ConversationHead)
	if err != nil {
		return err
	}
	if next == "" {
		return nil
	}
	s.log.Info("conversation moved on past an ended run", "conversation", h.Conversation, "ended", h.Run, "next", next)
	return s.Enqueue(ctx, next)
}
