// Package watchdog ends the runs whose executor stopped renewing their
// lease, and moves the conversations on whose head ended without its
// successor being enqueued. Executors and api processes each have one; the
// deployment's leader runs it.
package watchdog

import (
	"context"
	"log/slog"
	"strings"
	"time"

	"github.com/runbox-dev/runbox"
	"github.com/runbox-dev/runbox/internal/lifecycle"
)

// Interval is how often a watchdog looks for lost runs.
const Interval = time.Second

// LostMessage is what the client of a lost run is told.
const LostMessage = "the executor running this program stopped unexpectedly; the program was not run to its end"

// Watchdog ends runs whose executor stopped renewing their lease (it was
// killed, or lost its connection): their clients get an error and done
// instead of waiting for ever, and the run is never started again. Every
// executor and api has one; the deployment's leader runs it (ending a run
// is atomic, so two that overlap at a change of leader do not conflict).
//
// It also sweeps the conversations (Scheduler.Sweep), so that one whose
// head ended without its successor being enqueued moves on.
type Watchdog struct {
	lifecycle.Base
	store    Runs
	sched    Scheduler
	schedule lifecycle.Schedule
	log      *slog.Logger
}

// Runs are the runs' records, leases and event logs (store.Runs).
type Runs interface {
	ExpiredLeases(ctx context.Context, n int) ([]string, error)
	Run(ctx context.Context, id string) (runbox.Run, error)
	Events(ctx context.Context, id string, after int64) ([]runbox.Event, error)
	Finish(ctx context.Context, id string, e runbox.Ending) (runbox.Applied, error)
	Executor(ctx context.Context, id string) (string, error)
}

// Scheduler moves conversations on (*queue.Scheduler).
type Scheduler interface {
	// Enqueue queues runs that head their conversations, their turn come.
	Enqueue(ctx context.Context, ids ...string) error
	// Sweep moves on the conversations whose head ended.
	Sweep(ctx context.Context)
}

// New returns a watchdog over st that checks on schedule.
func New(st Runs, sched Scheduler, schedule lifecycle.Schedule, log *slog.Logger) *Watchdog {
	return &Watchdog{store: st, sched: sched, schedule: schedule, log: log.With("component", "watchdog")}
}

// Start checks every Interval until Stop.
func (w *Watchdog) Start(ctx context.Context) error {
	return w.Base.Run(ctx, w.schedule(Interval, w.Check))
}

// Check ends the runs whose lease has expired, and sweeps the
// conversations.
func (w *Watchdog) Check(ctx context.Context) {
	w.endLost(ctx)
	w.sched.Sweep(ctx)
}

func (w *Watchdog) endLost(ctx context.Context) {
	ids, err := w.store.ExpiredLeases(ctx, 100)
	if err != nil {
		w.log.Warn("read expired leases", "err", err)
		return
	}
	for _, id := range ids {
		if err := w.end(ctx, id); err != nil {
			w.log.Warn("end lost run", "run", id, "err", err)
		}
	}
}

func (w *Watchdog) end(ctx context.Context, id string) error {
	run, err := w.store.Run(ctx, id)
	if err != nil {
		return err
	}
	// The output so far is in the log: the client keeps it.
	evs, err := w.store.Events(ctx, id, 0)
	if err != nil {
		return err
	}
	var stdout, stderr strings.Builder
	var egress []runbox.Egress
	for _, ev := range evs {
		switch ev.Type {
		case runbox.EventStdout:
			stdout.WriteString(ev.Data)
		case runbox.EventStderr:
			stderr.WriteString(ev.Data)
		case runbox.EventEgress:
			if ev.Egress != nil {
				egress = append(egress, *ev.Egress)
			}
		}
	}
	res := &runbox.Result{
		ExitCode:       -1,
		Stdout:         stdout.String(),
		Stderr:         stderr.String(),
		Output:         stdout.String() + stderr.String(),
		RunID:          id,
		ConversationID: run.ConversationID,
		Files:          []runbox.FileInfo{},
		Artifacts:      []runbox.FileInfo{},
		Egress:         egress,
		Error:          LostMessage,
	}
	if !run.StartedAt.IsZero() {
		res.DurationMS = time.Since(run.StartedAt).Milliseconds()
	}
	a, err := w.store.Finish(ctx, id, runbox.Ending{
		From: []runbox.Status{runbox.StatusRunning}, Lease: runbox.LeaseExpired, Status: runbox.StatusError, Result: res,
		Events:       []runbox.Event{{TS: time.Now(), Type: runbox.EventError, Message: LostMessage}},
		Conversation: run.ConversationID,
	})
	if err != nil {
		return err
	}
	if a.Done {
		executor, _ := w.store.Executor(ctx, id)
		w.log.Warn("ended a run whose executor stopped", "run", id, "executor", executor)
	}
	return w.sched.Enqueue(ctx, a.Dispatch...)
}
