package executor

import (
	"context"
	"io"
	"time"

	"github.com/runbox-dev/runbox"
	"github.com/runbox-dev/runbox/internal/store"
	"github.com/runbox-dev/runbox/internal/watchdog"
)

// Store is what the executor reads and writes of the shared state (a
// *store.Store): its runs, the conversations it holds, and its place
// among the executors. The watchdog and the peer reaper it runs take
// their parts of it.
type Store interface {
	// Runs: claim, events, input, cancellations, end.
	ClaimFor(ctx context.Context, id, executor string, lease, ownerTTL time.Duration) (runbox.Claimed, error)
	Append(ctx context.Context, id string, evs ...runbox.Event) error
	Detach(ctx context.Context, id, cid string) ([]string, error)
	Stdin(ctx context.Context, id string) io.Reader
	CancelRequested(ctx context.Context, ids ...string) ([]runbox.CancelRequest, error)
	RenewLeases(ctx context.Context, lease time.Duration, ids ...string) ([]string, error)
	SubscribeCancels(ctx context.Context) (*store.Subscription, error)
	watchdog.Runs

	// Conversations: kept interpreters' state, closed conversations.
	KeptState(ctx context.Context, cid string, fresh, died bool) (lost bool, err error)
	SubscribeClosed(ctx context.Context) (*store.Subscription, error)

	// Executors: this one's heartbeat, ownership and wake-ups; its peers.
	Heartbeat(ctx context.Context, info runbox.ExecutorInfo, ttl time.Duration) error
	Unregister(ctx context.Context, id string) error
	Drain(ctx context.Context, executor string, ttl time.Duration) error
	SetOwner(ctx context.Context, cid, executor string, ttl time.Duration) error
	AwaitWake(ctx context.Context, d time.Duration, executor string, mineFirst bool) (string, error)
	peerStore
}
