package executor

import (
	"context"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/runbox-dev/runbox"
	"github.com/runbox-dev/runbox/internal/lifecycle"
	"github.com/runbox-dev/runbox/internal/store"
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

// renew is one heartbeat. While Redis cannot be reached (it restarts,
// say) the beat is tried again soon, not at the next beat, until that one
// is due: once Redis is back, the runs' leases are renewed before the
// watchdog, which looks every second, finds them expired. A lease does
// expire during an outage longer than itself (Config.Lease): the
// watchdog then ends its run (docs/deploy.md).
func (e *Executor) renew(ctx context.Context) {
	due := make(chan struct{}) // the next beat
	t := e.cfg.Clock.AfterFunc(e.cfg.HeartbeatInterval, func() { close(due) })
	defer t.Stop()
	var ids, lost []string
	err := e.retry.do(ctx, due, &e.beats, func(ctx context.Context) error {
		err := e.register(ctx)
		if store.Transient(err) {
			return err
		}
		if err != nil {
			e.log.Warn("heartbeat", "err", err)
		}
		var claimed []string
		ids, claimed = e.activeRuns()
		lost, err = e.store.RenewLeases(ctx, e.cfg.Lease, claimed...)
		return err
	})
	if err != nil {
		if !store.Transient(err) {
			e.log.Warn("renew leases", "err", err)
		}
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

// activeRuns returns the ids of the runs active here, and of those among
// them that were claimed (whose lease is this executor's to renew).
func (e *Executor) activeRuns() (ids, claimed []string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	ids = make([]string, 0, len(e.active))
	for id, a := range e.active {
		ids = append(ids, id)
		if a.claimed {
			claimed = append(claimed, id)
		}
	}
	return ids, claimed
}
