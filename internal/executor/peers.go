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
// slots. Its other locks need no one: the leader lease, if it held it,
// lapsed before it could be found dead (leader.TTL is 5 s, against a 10 s
// heartbeat and a 6 s watch), and the conversations' lock files are
// flocks, which its kernel released with the process.

// peerBeatWindow is how long a stopping executor watches its peers'
// heartbeats: a live one beats every HeartbeatInterval, so one that has
// not in three is taken for dead.
const peerBeatWindow = 3

// reapPeers removes the containers here of this deployment's other
// executors that alive does not vouch for and that are older than minAge,
// and releases what each of those executors held.
func (e *Executor) reapPeers(ctx context.Context, alive func(string) bool, minAge time.Duration) {
	removed, err := e.sandboxes.ReapDead(ctx, alive, minAge)
	if err != nil {
		e.log.Warn("reap the sandboxes of dead executors", "err", err)
		return
	}
	for _, peer := range slices.Sorted(maps.Keys(removed)) {
		e.log.Info("removed the sandboxes of a dead executor", "peer", peer, "count", removed[peer])
		e.release(ctx, peer)
	}
}

// release gives up what a dead executor held.
func (e *Executor) release(ctx context.Context, peer string) {
	if err := e.store.Unregister(ctx, peer); err != nil {
		e.log.Warn("unregister a dead executor", "peer", peer, "err", err)
	}
	runs, err := e.store.ExpireLeasesOf(ctx, peer)
	if err != nil {
		e.log.Warn("expire a dead executor's leases", "peer", peer, "err", err)
	} else if len(runs) > 0 {
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
	alive := e.watchBeats(ctx, peers, peerBeatWindow*e.cfg.HeartbeatInterval)
	e.reapPeers(ctx, func(id string) bool { return alive[id] }, 0)
}

// watchBeats returns which of peers beat within window: at once for those
// that do, at its end for the rest.
func (e *Executor) watchBeats(ctx context.Context, peers []string, window time.Duration) map[string]bool {
	alive := map[string]bool{}
	first, err := e.store.Beats(ctx, peers...)
	if err != nil {
		e.log.Warn("read the heartbeats of other executors; taking them for alive", "err", err)
		for _, p := range peers {
			alive[p] = true
		}
		return alive
	}
	tick := e.cfg.Clock.NewTicker(e.cfg.HeartbeatInterval / 4)
	defer tick.Stop()
	end := e.cfg.Clock.After(window)
	for len(alive) < len(peers) {
		select {
		case <-ctx.Done():
			return alive
		case <-end:
			return alive
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
	return alive
}
