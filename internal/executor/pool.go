package executor

import (
	"context"
	"time"

	"github.com/runbox-dev/runbox/internal/lifecycle"
)

// MaxPool bounds the sandboxes of one language that wait in the pool,
// started or recycled, for new conversations: enough for a burst without a
// container start, few enough that idle ones cost little memory.
const MaxPool = 16

// poolRetry is how often the pool is topped up without a wake-up (a failed
// start is tried again).
const poolRetry = 5 * time.Second

// poolFiller keeps sandboxes of each language started, waiting for new
// conversations — as many as the manager's PoolTarget says: the
// configured Pool, more while new conversations come faster than recycled
// sandboxes — at start, after each adoption (Executor.poolWake), and
// every poolRetry.
type poolFiller struct {
	lifecycle.Base
	e *Executor
}

func (p *poolFiller) Start(ctx context.Context) error {
	return p.Base.Run(ctx, p.loop)
}

func (p *poolFiller) loop(ctx context.Context) {
	e := p.e
	t := e.cfg.Clock.NewTicker(poolRetry)
	defer t.Stop()
	for {
		for _, r := range e.runners {
			for e.sandboxes.Pooled(r.Language) < e.sandboxes.PoolTarget(r.Language, e.cfg.Pool.For(r.Language), MaxPool) && ctx.Err() == nil {
				if err := p.prestart(ctx, r.Language); err != nil {
					e.log.Warn("start a sandbox for the pool", "language", r.Language, "err", err)
					break
				}
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-e.poolWake:
		case <-t.Chan():
		}
	}
}

func (p *poolFiller) prestart(ctx context.Context, language string) error {
	e := p.e
	slot, err := e.folders.NewSlot(NewSlotName(e.cfg.ID))
	if err != nil {
		return err
	}
	if err := e.sandboxes.Prestart(ctx, language, slot); err != nil {
		if rerr := e.folders.RemoveSlot(slot); rerr != nil {
			e.log.Warn("remove slot", "err", rerr)
		}
		return err
	}
	return nil
}
