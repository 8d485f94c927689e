package e2b

import (
	"context"
	"errors"
	"time"

	"github.com/runbox-dev/runbox"
	"github.com/runbox-dev/runbox/internal/lifecycle"
)

// Sweeper ends the sandboxes whose end has come — paused with
// autoPause, else killed — every second, in every api process: each
// sandbox due is taken by one of them (store.DueE2BSandboxes), and comes
// due again shortly unless its taker ended it.
type Sweeper struct {
	lifecycle.Base
	s *Service
}

// sweepBatch bounds the sandboxes one round takes.
const sweepBatch = 50

// NewSweeper returns the sweeper of svc's sandboxes.
func NewSweeper(svc *Service) *Sweeper { return &Sweeper{s: svc} }

// Start runs the rounds until Stop, and the keepalive's.
func (w *Sweeper) Start(ctx context.Context) error {
	return w.Base.Run(ctx, func(ctx context.Context) {
		if every := w.s.limits.KeepAlive; every > 0 {
			go lifecycle.Every(w.s.clock, every, w.keepAlive)(ctx)
		}
		lifecycle.Every(w.s.clock, time.Second, w.round)(ctx)
	})
}

// maxKeptAlive bounds the sandboxes one keepalive round reaches.
const maxKeptAlive = 10000

// keepAlive reaches the daemon of each running sandbox, which marks its
// background run active: a sandbox lives to its timeout, not to runbox's
// idle bound for servers.
func (w *Sweeper) keepAlive(ctx context.Context) {
	ids, err := w.s.store.LiveE2BSandboxes(ctx, w.s.clock.Now(), maxKeptAlive)
	if err != nil {
		if ctx.Err() == nil {
			w.s.log.Warn("list the running sandboxes", "err", err)
		}
		return
	}
	for _, id := range ids {
		sb, err := w.s.store.E2BSandbox(ctx, id)
		if err != nil || sb.State != runbox.E2BRunning {
			continue
		}
		w.s.targets.forget(id)
		if _, err := w.s.targets.find(ctx, sb); err != nil && ctx.Err() == nil {
			w.s.log.Debug("reach a running sandbox's daemon", "sandbox", id, "err", err)
		}
	}
}

// round ends the sandboxes due now.
func (w *Sweeper) round(ctx context.Context) {
	ids, err := w.s.store.DueE2BSandboxes(ctx, w.s.clock.Now(), sweepBatch)
	if err != nil {
		if ctx.Err() == nil {
			w.s.log.Warn("take the sandboxes whose end came", "err", err)
		}
		return
	}
	for _, id := range ids {
		if err := w.s.end(ctx, id); err != nil {
			w.s.log.Warn("end a sandbox whose end came; trying again shortly", "sandbox", id, "err", err)
		}
	}
}

// end ends sandbox id if its end came (a timeout moved since it was
// taken is kept: saving it put it back).
func (s *Service) end(ctx context.Context, id string) error {
	sb, err := s.store.E2BSandbox(ctx, id)
	if errors.Is(err, runbox.ErrE2BSandboxNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	if sb.State != runbox.E2BRunning {
		return nil
	}
	if s.clock.Now().Before(sb.EndAt) {
		s.putBack(ctx, id)
		return nil
	}
	s.log.Info("a sandbox's timeout came", "sandbox", id, "pause", sb.AutoPause)
	_, err = s.expire(ctx, sb)
	if errors.Is(err, runbox.ErrE2BSandboxNotFound) {
		return nil
	}
	return err
}

// putBack saves a sandbox as it is, which puts it back among the ends.
func (s *Service) putBack(ctx context.Context, id string) {
	if _, err := s.update(ctx, id, func(*runbox.E2BSandbox) error { return nil }); err != nil &&
		!errors.Is(err, runbox.ErrE2BSandboxNotFound) {
		s.log.Warn("put a sandbox back among the ends", "sandbox", id, "err", err)
	}
}
