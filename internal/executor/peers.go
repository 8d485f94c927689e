package executor

import (
	"context"
	"maps"
	"slices"
	"time"
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

// reapPeers removes the containers here of this deployment's other
// executors that alive does not vouch for and that are older than minAge,
// and releases what each of those executors held — unless it beat since
// seen (their heartbeats' expiry, read before alive judged them).
func (e *Executor) reapPeers(ctx context.Context, seen map[string]int64, alive func(string) bool, minAge time.Duration) {
	removed, err := e.sandboxes.ReapDead(ctx, alive, minAge)
	if err != nil {
		e.log.Warn("reap the sandboxes of dead executors", "err", err)
		return
	}
	for _, peer := range slices.Sorted(maps.Keys(removed)) {
		e.log.Info("removed the sandboxes of a dead executor", "peer", peer, "count", removed[peer])
		e.release(ctx, peer, seen[peer])
	}
}

// release gives up what a dead executor held, unless it beat since seen:
// removing its containers can take seconds, and an executor that restarts
// under the same id (a container's hostname) removes its old ones too,
// then registers and starts runs and sandboxes that are its own.
func (e *Executor) release(ctx context.Context, peer string, seen int64) {
	released, runs, err := e.store.ReleaseDead(ctx, peer, seen)
	switch {
	case err != nil:
		e.log.Warn("release a dead executor", "peer", peer, "err", err)
		return
	case !released:
		e.log.Info("a dead executor is alive again: it keeps what it holds", "peer", peer)
		return
	case len(runs) > 0:
		e.watchdog.Check(ctx)
	}
	if err := e.folders.RemoveSlots(SlotPrefix(peer)); err != nil {
		e.log.Warn("remove a dead executor's slots", "peer", peer, "err", err)
	}
}

// reapPeersAtShutdown is reapPeers for an executor that stops: a peer is
// alive if its heartbeat moves within peerBeatWindow heartbeats, however
// current it is (a peer killed a moment ago still has one).
func (e *Executor) reapPeersAtShutdown(ctx context.Context) {
	peers, err := e.sandboxes.Peers(ctx)
	if err != nil {
		e.log.Warn("list the sandboxes of other executors", "err", err)
		return
	}
	if len(peers) == 0 {
		return
	}
	seen, alive := e.watchBeats(ctx, peers, peerBeatWindow*e.cfg.HeartbeatInterval)
	e.reapPeers(ctx, seen, func(id string) bool { return alive[id] }, 0)
}

// watchBeats returns which of peers beat within window (at once for those
// that do, at its end for the rest), and their heartbeats' expiry when it
// began.
func (e *Executor) watchBeats(ctx context.Context, peers []string, window time.Duration) (first map[string]int64, alive map[string]bool) {
	alive = map[string]bool{}
	first, err := e.store.Beats(ctx, peers...)
	if err != nil {
		e.log.Warn("read the heartbeats of other executors; taking them for alive", "err", err)
		for _, p := range peers {
			alive[p] = true
		}
		return first, alive
	}
	tick := e.cfg.Clock.NewTicker(e.cfg.HeartbeatInterval / 4)
	defer tick.Stop()
	end := e.cfg.Clock.After(window)
	for len(alive) < len(peers) {
		select {
		case <-ctx.Done():
			return first, alive
		case <-end:
			return first, alive
		case <-tick.Chan():
		}
		now, err := e.store.Beats(ctx, peers...)
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
