package conversations

import (
	"context"
	"log/slog"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/runbox-dev/runbox"
	"github.com/runbox-dev/runbox/internal/lifecycle"
)

// Expiry removes from a remote file store the conversations whose files
// were not used for retention (SANDBOX_FILE_RETENTION). Every upload and
// every run marks a use (the store's FilesChanged, FilesUsed); a
// conversation with a run queued or running is never touched.
type Expiry struct {
	lifecycle.Base
	schedule  lifecycle.Schedule
	files     runbox.FileStore
	store     Usage
	retention time.Duration
	clock     clockwork.Clock
	log       *slog.Logger
}

// Usage is what Expiry reads of conversations' use (the store's
// Conversations).
type Usage interface {
	// FilesUnusedSince lists up to n conversations whose files were last
	// used before t.
	FilesUnusedSince(ctx context.Context, t time.Time, n int64) ([]string, error)
	Busy
}

// Busy tells whether a conversation has a run queued or running (the
// store's Conversations).
type Busy interface {
	Busy(ctx context.Context, cid string) (bool, error)
}

// expiryBatch bounds the conversations one sweep removes.
const expiryBatch = 100

// NewExpiry returns an Expiry; fs is the store as the api changes it
// (workcopy.Versioned), so that a removal also drops the version.
func NewExpiry(fs runbox.FileStore, st Usage, retention time.Duration, clock clockwork.Clock, schedule lifecycle.Schedule, log *slog.Logger) *Expiry {
	return &Expiry{files: fs, store: st, retention: retention, clock: clock, schedule: schedule, log: log.With("component", "expiry")}
}

// Start sweeps every JanitorInterval until Stop.
func (x *Expiry) Start(ctx context.Context) error {
	return x.Base.Run(ctx, x.schedule(JanitorInterval, x.Sweep))
}

// Sweep removes what is past its retention.
func (x *Expiry) Sweep(ctx context.Context) {
	ids, err := x.store.FilesUnusedSince(ctx, x.clock.Now().Add(-x.retention), expiryBatch)
	if err != nil {
		x.log.Warn("list unused conversations", "err", err)
		return
	}
	for _, cid := range ids {
		if busy, err := x.store.Busy(ctx, cid); err != nil || busy {
			continue
		}
		if err := x.files.Remove(ctx, cid); err != nil {
			x.log.Warn("remove expired conversation", "conversation", cid, "err", err)
			continue
		}
		x.log.Info("removed a conversation past its retention", "conversation", cid)
	}
}
