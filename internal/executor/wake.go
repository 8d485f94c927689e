package executor

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/runbox-dev/runbox/internal/lifecycle"
)

// announceWait is how long one wait for an announced run lasts; it bounds
// how long stopping takes.
const announceWait = time.Second

// announcements runs the runs announced as they are enqueued (see
// store.Executors.Wake) while this executor has a free slot, so that a
// run starts at once without asynq polling often. Stop stops taking them
// and waits for the loop, not for the runs it started (Executor.runs:
// Shutdown waits for them, as for asynq's).
type announcements struct {
	lifecycle.Base
	// await waits up to d for an announced run (store.AwaitWake).
	await func(ctx context.Context, d time.Duration, mineFirst bool) (string, error)
	// process runs an announced run, holding sl.
	process func(ctx context.Context, id string, sl *slot) error
	slots   chan struct{} // the executor's
	runs    *sync.WaitGroup
	count   prometheus.Counter
	clock   clockwork.Clock
	log     *slog.Logger
}

func (a *announcements) Start(ctx context.Context) error {
	return a.Base.Run(ctx, a.loop)
}

func (a *announcements) loop(ctx context.Context) {
	for mine := true; ; mine = !mine {
		// A slot first: an executor that is full leaves announced runs
		// to others, or to asynq.
		select {
		case a.slots <- struct{}{}:
		case <-ctx.Done():
			return
		}
		id, err := a.await(ctx, announceWait, mine)
		if id == "" {
			<-a.slots
			if ctx.Err() != nil {
				return
			}
			if err != nil {
				a.log.Warn("wait for announced runs", "err", err)
				select {
				case <-ctx.Done():
					return
				case <-a.clock.After(announceWait):
				}
			}
			continue
		}
		a.count.Inc()
		a.log.Debug("took an announced run", "run", id)
		sl := &slot{ch: a.slots}
		a.runs.Go(func() {
			defer sl.release()
			if err := a.process(context.WithoutCancel(ctx), id, sl); err != nil {
				a.log.Warn("run an announced run", "run", id, "err", err)
			}
		})
	}
}
