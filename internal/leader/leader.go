// Package leader elects the one process of a deployment that does its
// maintenance: ending lost runs, sweeping conversations, removing expired
// files. Several processes doing it would be safe (each step is atomic)
// but would multiply Redis's load with every api and executor added.
package leader

import (
	"context"
	"crypto/rand"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/runbox-dev/runbox/internal/lifecycle"
)

const (
	// Interval is how often a process tries to take or renew the lease.
	Interval = time.Second
	// TTL is how long the lease outlives its last renewal: another process
	// takes over at most this long (and one Interval) after a leader dies.
	TTL = 5 * time.Second
)

// Lease is the leader lease in the shared state (store.Executors).
type Lease interface {
	// Lead takes or renews the lease for holder, for ttl; it reports
	// whether holder holds it.
	Lead(ctx context.Context, holder string, ttl time.Duration) (bool, error)
	// Resign gives the lease up if holder holds it.
	Resign(ctx context.Context, holder string) error
}

// Elector holds or seeks the leader lease for its process.
type Elector struct {
	lifecycle.Base
	store   Lease
	clock   clockwork.Clock
	log     *slog.Logger
	holder  string
	leading atomic.Bool
}

// NewElector returns an Elector; name says which process it is, in logs.
func NewElector(st Lease, name string, clock clockwork.Clock, log *slog.Logger) *Elector {
	return &Elector{store: st, clock: clock, log: log.With("component", "leader"),
		holder: name + "/" + rand.Text()[:8]}
}

// Leading reports whether this process led at its last try.
func (e *Elector) Leading() bool { return e.leading.Load() }

// Start tries at once and then every Interval, until Stop, which resigns.
func (e *Elector) Start(ctx context.Context) error {
	e.try(ctx)
	return e.Base.Run(ctx, func(ctx context.Context) {
		lifecycle.Every(e.clock, Interval, e.try)(ctx)
		e.leading.Store(false)
		if err := e.store.Resign(context.WithoutCancel(ctx), e.holder); err != nil {
			e.log.Warn("resign", "err", err)
		}
	})
}

func (e *Elector) try(ctx context.Context) {
	leads, err := e.store.Lead(ctx, e.holder, TTL)
	if err != nil {
		if ctx.Err() == nil {
			e.log.Warn("leader lease", "err", err)
		}
		leads = false
	}
	if was := e.leading.Swap(leads); was != leads {
		e.log.Info("leadership changed", "leading", leads, "holder", e.holder)
	}
}

// Every returns a loop that calls f every d while the elector leads.
func (e *Elector) Every(d time.Duration, f func(context.Context)) func(context.Context) {
	return lifecycle.Every(e.clock, d, func(ctx context.Context) {
		if e.Leading() {
			f(ctx)
		}
	})
}
