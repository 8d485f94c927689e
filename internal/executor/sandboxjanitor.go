package executor

import (
	"context"
	"log/slog"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/runbox-dev/runbox/internal/lifecycle"
)

const (
	pruneInterval = 30 * time.Second
	reapInterval  = time.Minute
	// deadReapInterval is how often an executor looks for the sandboxes
	// of a dead peer; with the heartbeat TTL it bounds how long they
	// outlive it (~25 s).
	deadReapInterval = 15 * time.Second
)

// sandboxJanitor keeps this Docker host's sandboxes in order: idle ones
// past their TTL go, so do dangling ones (a run's that outlived it) and
// those of this deployment's executors whose heartbeat lapsed. Every
// executor runs one: the containers are its host's.
type sandboxJanitor struct {
	lifecycle.Base
	sandboxes janitorSandboxes
	peers     *peerReaper
	clock     clockwork.Clock
	log       *slog.Logger
}

func (j *sandboxJanitor) Start(ctx context.Context) error {
	return j.Base.Run(ctx, func(ctx context.Context) {
		prune, reap, dead := j.clock.NewTicker(pruneInterval), j.clock.NewTicker(reapInterval), j.clock.NewTicker(deadReapInterval)
		defer prune.Stop()
		defer reap.Stop()
		defer dead.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-prune.Chan():
				j.prune()
			case <-reap.Chan():
				j.reap(ctx)
			case <-dead.Chan():
				j.peers.reapLapsed(ctx)
			}
		}
	})
}

func (j *sandboxJanitor) prune() {
	if n := j.sandboxes.Prune(); n > 0 {
		j.log.Info("removed idle sandboxes", "count", n)
	}
}

func (j *sandboxJanitor) reap(ctx context.Context) {
	if n, err := j.sandboxes.Reap(ctx, reapInterval); err != nil {
		j.log.Warn("reap sandboxes", "err", err)
	} else if n > 0 {
		j.log.Warn("removed dangling sandboxes", "count", n)
	}
}
