package executor

import (
	"context"
	"log/slog"
	"maps"
	"slices"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/runbox-dev/runbox"
)

// The sandboxes of an executor that died (killed, its host's engine
// restarted under it, a replica scaled away) are its peers' to remove: a
// live executor of the deployment on the same Docker host removes them
// once the dead one's heartbeat has lapsed (sandboxJanitor), and an
// executor that stops in order removes those of every peer it finds not
// alive, lapsed or not — it may be the last of its deployment on this
// host, with nobody left to do it later. With the containers go what the
// dead executor held: its runs' leases (the watchdog ends those runs at
// once), its registration (its conversations' next runs go to any
// executor: an owner that is not registered owns nothing), and its pool's
// slots — unless it beat since it was found dead: one restarted under the
// same id keeps what it holds by then (store.ReleaseDead decides that and
// releases in one step). Its other locks need no one: the leader lease,
// if it held it, lapsed before it could be found dead (leader.TTL is 5 s,
// against a 10 s heartbeat and a 6 s watch), and the conversations' lock
// files are flocks, which its kernel released with the process.

// peerBeatWindow is how long a stopping executor watches its peers'
// heartbeats: a live one beats every HeartbeatInterval, so one that has
// not in three is taken for dead.
const peerBeatWindow = 3

// peerReaper removes the sandboxes here of this deployment's dead
// executors and releases what they held.
type peerReaper struct {
	sandboxes peerSandboxes
	store     peerStore
	slots     slotWorkspace
	// endLost ends the runs whose lease lapsed (the watchdog's Check).
	endLost  func(context.Context)
	interval time.Duration // of the heartbeats
	clock    clockwork.Clock
	log      *slog.Logger
}

// peerStore is what the reaper asks of the store.
type peerStore interface {
	Beats(ctx context.Context, ids ...string) (map[string]int64, error)
	LiveExecutors(ctx context.Context) ([]runbox.ExecutorInfo, error)
	ReleaseDead(ctx context.Context, executor string, seen int64) (released bool, runs []string, err error)
}

// reapLapsed removes the sandboxes of this deployment's executors whose
// heartbeat lapsed. A container younger than a heartbeat TTL is left
// alone: its executor may not have registered yet.
func (r *peerReaper) reapLapsed(ctx context.Context) {
	peers := r.list(ctx)
	if len(peers) == 0 {
		return
	}
	seen, err := r.store.Beats(ctx, peers...)
	if err != nil {
		r.log.Warn("reap the sandboxes of dead executors", "err", err)
		return
	}
	infos, err := r.store.LiveExecutors(ctx)
	if err != nil {
		r.log.Warn("reap the sandboxes of dead executors", "err", err)
		return
	}
	alive := make(map[string]bool, len(infos))
	for _, info := range infos {
		alive[info.ID] = true
	}
	r.reap(ctx, seen, func(id string) bool { return alive[id] }, 5*r.interval)
}

// reap removes the containers here of this deployment's other executors
// that alive does not vouch for and that are older than minAge, and
// releases what each of those executors held — unless it beat since seen
// (their heartbeats' expiry, read before alive judged them).
func (r *peerReaper) reap(ctx context.Context, seen map[string]int64, alive func(string) bool, minAge time.Duration) {
	removed, err := r.sandboxes.ReapDead(ctx, alive, minAge)
	if err != nil {
		r.log.Warn("reap the sandboxes of dead executors", "err", err)
		return
	}
	for _, peer := range slices.Sorted(maps.Keys(removed)) {
		r.log.Info("removed the sandboxes of a dead executor", "peer", peer, "count", removed[peer])
		r.release(ctx, peer, seen[peer])
	}
}

// release gives up what a dead executor held, unless it beat since seen:
// removing its containers can take seconds, and an executor that restarts
// under the same id (a container's hostname) removes its old ones too,
// then registers and starts runs and sandboxes that are its own.
func (r *peerReaper) release(ctx context.Context, peer string, seen int64) {
	released, runs, err := r.store.ReleaseDead(ctx, peer, seen)
	switch {
	case err != nil:
		r.log.Warn("release a dead executor", "peer", peer, "err", err)
		return
	case !released:
		r.log.Info("a dead executor is alive again: it keeps what it holds", "peer", peer)
		return
	case len(runs) > 0:
		r.endLost(ctx)
	}
	if err := r.slots.RemoveSlots(SlotPrefix(peer)); err != nil {
		r.log.Warn("remove a dead executor's slots", "peer", peer, "err", err)
	}
}

// atShutdown is reap for an executor that stops: a peer is alive if its
// heartbeat moves within peerBeatWindow heartbeats, however current it is
// (a peer killed a moment ago still has one).
func (r *peerReaper) atShutdown(ctx context.Context) {
	peers := r.list(ctx)
	if len(peers) == 0 {
		return
	}
	seen, alive := r.watchBeats(ctx, peers, peerBeatWindow*r.interval)
	r.reap(ctx, seen, func(id string) bool { return alive[id] }, 0)
}

// list returns the other executors of the deployment with sandboxes
// here; none if they cannot be listed (a warning).
func (r *peerReaper) list(ctx context.Context) []string {
	peers, err := r.sandboxes.Peers(ctx)
	if err != nil {
		r.log.Warn("list the sandboxes of other executors", "err", err)
	}
	return peers
}

// watchBeats returns which of peers beat within window (at once for those
// that do, at its end for the rest), and their heartbeats' expiry when it
// began.
func (r *peerReaper) watchBeats(ctx context.Context, peers []string, window time.Duration) (first map[string]int64, alive map[string]bool) {
	alive = map[string]bool{}
	first, err := r.store.Beats(ctx, peers...)
	if err != nil {
		r.log.Warn("read the heartbeats of other executors; taking them for alive", "err", err)
		for _, p := range peers {
			alive[p] = true
		}
		return first, alive
	}
	tick := r.clock.NewTicker(r.interval / 4)
	defer tick.Stop()
	end := r.clock.After(window)
	for len(alive) < len(peers) {
		select {
		case <-ctx.Done():
			return first, alive
		case <-end:
			return first, alive
		case <-tick.Chan():
		}
		now, err := r.store.Beats(ctx, peers...)
		if err != nil {
			continue
		}
		for _, p := range peers {
			if now[p] > first[p] {
				alive[p] = true
			}
		}
	}
	return first, alive
}
