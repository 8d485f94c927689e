package conversations

import (
	"context"
	"log/slog"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/runbox-dev/runbox"
	"github.com/runbox-dev/runbox/internal/lifecycle"
	"github.com/runbox-dev/runbox/internal/store"
)

// Expiry removes from a remote file store the conversations whose files
// were not used for retention (SANDBOX_FILE_RETENTION). Every upload and
// every run marks a use (store.FilesChanged, store.FilesUsed); a
// conversation with a run queued or running is never touched.
type Expiry struct {
	lifecycle.Base
	schedule  lifecycle.Schedule
	files     runbox.FileStore
	store     *store.Store
	retention time.Duration
	clock     clockwork.Clock
	log       *slog.Logger
}

// expiryBatch bounds the conversations one sweep removes.
const expiryBatch = 100

// NewExpiry returns an Expiry; fs is the store as the api changes it
// (workcopy.Versioned), so that a removal also drops the version.
func NewExpiry(fs runbox.FileStore, st *store.Store, retention time.Duration, clock clockwork.Clock, schedule lifecycle.Schedule, log *slog.Logger) *Expiry {
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
