package executor

import (
	"context"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/runbox-dev/runbox"
	"github.com/runbox-dev/runbox/internal/lifecycle"
)

// heartbeat beats every interval: the executor's renew keeps it
// registered and its runs' leases current, and stops runs whose lease
// someone else ended.
type heartbeat struct {
	lifecycle.Base
	beat     func(context.Context)
	interval time.Duration
	clock    clockwork.Clock
}

func (h *heartbeat) Start(ctx context.Context) error {
	return h.Base.Run(ctx, lifecycle.Every(h.clock, h.interval, h.beat))
}

// register records the executor in Redis for five heartbeats.
func (e *Executor) register(ctx context.Context) error {
	return e.store.Heartbeat(ctx, runbox.ExecutorInfo{
		ID: e.cfg.ID, Concurrency: e.cfg.Concurrency, Runners: e.runners, StartedAt: e.started,
		Templates: e.sandboxes.Templates(), Addr: e.cfg.LinkAddr,
		Landlock: e.landlock, Conversations: e.sandboxes.Conversations(),
	}, 5*e.cfg.HeartbeatInterval)
}

// renew is one heartbeat.
func (e *Executor) renew(ctx context.Context) {
	if err := e.register(ctx); err != nil {
		e.log.Warn("heartbeat", "err", err)
	}
	e.mu.Lock()
	ids := make([]string, 0, len(e.active))
	var claimed []string
	for id, a := range e.active {
		ids = append(ids, id)
		if a.claimed {
			claimed = append(claimed, id)
		}
	}
	e.mu.Unlock()
	lost, err := e.store.RenewLeases(ctx, e.cfg.Lease, claimed...)
	if err != nil {
		e.log.Warn("renew leases", "err", err)
		return
	}
	for _, id := range lost {
		e.cancel(id, ErrLeaseLost)
	}
	// Cancellations normally arrive by pub/sub at once; this catches one
	// published while the subscription was reconnecting.
	cancelled, err := e.store.CancelRequested(ctx, ids...)
	if err != nil {
		e.log.Warn("read cancellations", "err", err)
	}
	for _, c := range cancelled {
		e.cancel(c.ID, userCancel(c))
	}
}
