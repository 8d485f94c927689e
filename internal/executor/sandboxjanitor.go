package executor

import (
	"context"
	"time"

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
	e *Executor
}

func (j *sandboxJanitor) Start(ctx context.Context) error {
	clock := j.e.cfg.Clock
	return j.Base.Run(ctx, func(ctx context.Context) {
		prune, reap, dead := clock.NewTicker(pruneInterval), clock.NewTicker(reapInterval), clock.NewTicker(deadReapInterval)
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
				j.reapDead(ctx)
			}
		}
	})
}

func (j *sandboxJanitor) prune() {
	if n := j.e.sandboxes.Prune(); n > 0 {
		j.e.log.Info("removed idle sandboxes", "count", n)
	}
}

func (j *sandboxJanitor) reap(ctx context.Context) {
	if n, err := j.e.sandboxes.Reap(ctx, reapInterval); err != nil {
		j.e.log.Warn("reap sandboxes", "err", err)
	} else if n > 0 {
		j.e.log.Warn("removed dangling sandboxes", "count", n)
	}
}

// reapDead removes the sandboxes of this deployment's executors whose
// heartbeat lapsed (peers.go). A container younger than a heartbeat TTL
// is left alone: its executor may not have registered yet.
func (j *sandboxJanitor) reapDead(ctx context.Context) {
	e := j.e
	peers, err := e.sandboxes.Peers(ctx)
	if err != nil {
		e.log.Warn("list the sandboxes of other executors", "err", err)
		return
	}
	if len(peers) == 0 {
		return
	}
	seen, err := e.store.Beats(ctx, peers...)
	if err != nil {
		e.log.Warn("reap the sandboxes of dead executors", "err", err)
		return
	}
	infos, err := e.store.Executors(ctx)
	if err != nil {
		e.log.Warn("reap the sandboxes of dead executors", "err", err)
		return
	}
	alive := make(map[string]bool, len(infos))
	for _, info := range infos {
		alive[info.ID] = true
	}
	e.reapPeers(ctx, seen, func(id string) bool { return alive[id] }, 5*e.cfg.HeartbeatInterval)
}
