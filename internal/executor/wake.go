package executor

import (
	"context"
	"time"

	"github.com/runbox-dev/runbox/internal/lifecycle"
)

// announceWait is how long one wait for an announced run lasts; it bounds
// how long stopping takes.
const announceWait = time.Second

// announcements runs the runs announced as they are enqueued (see
// store.Wake) while this executor has a free slot, so that a run starts at
// once without asynq polling often. Stop stops taking them and waits for
// the loop, not for the runs it started (Executor.runs: Shutdown waits for
// them, as for asynq's).
type announcements struct {
	lifecycle.Base
	e *Executor
}

func (a *announcements) Start(ctx context.Context) error {
	return a.Base.Run(ctx, a.loop)
}

func (a *announcements) loop(ctx context.Context) {
	e := a.e
	for mine := true; ; mine = !mine {
		// A slot first: an executor that is full leaves announced runs
		// to others, or to asynq.
		select {
		case e.slots <- struct{}{}:
		case <-ctx.Done():
			return
		}
		id, err := e.store.AwaitWake(ctx, announceWait, e.cfg.ID, mine)
		if id == "" {
			<-e.slots
			if ctx.Err() != nil {
				return
			}
			if err != nil {
				e.log.Warn("wait for announced runs", "err", err)
				select {
				case <-ctx.Done():
					return
				case <-e.cfg.Clock.After(announceWait):
				}
			}
			continue
		}
		e.metrics.announced.Inc()
		e.log.Debug("took an announced run", "run", id)
		sl := &slot{ch: e.slots}
		e.runs.Go(func() {
			defer sl.release()
			if err := e.process(context.WithoutCancel(ctx), id, sl); err != nil {
				e.log.Warn("run an announced run", "run", id, "err", err)
			}
		})
	}
}
