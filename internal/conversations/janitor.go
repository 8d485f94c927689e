package conversations

import (
	"context"
	"log/slog"
	"time"

	"github.com/runbox-dev/runbox/internal/files"
	"github.com/runbox-dev/runbox/internal/lifecycle"
)

// JanitorInterval is how often the janitor looks at conversations.
const JanitorInterval = time.Minute

// Janitor releases what idle conversations hold: after idle (twice the
// session TTL, so that no warm sandbox still uses them) their disk images
// are unmounted; after retention, if set, their files are deleted. A
// conversation with a run queued or running is never touched.
type Janitor struct {
	lifecycle.Base
	schedule  lifecycle.Schedule
	folders   *files.Folders
	store     Busy
	idle      time.Duration
	retention time.Duration // 0: files are kept until close_session
	log       *slog.Logger
	forget    func(cid string)
}

// BeforeRemove sets what is told of a conversation before its folder may
// be removed: an executor's working copies forget what they knew of it,
// so that its next run fetches it whole — even one that found the folder
// there just before the removal and has it made again, empty. Call it
// before Start.
func (j *Janitor) BeforeRemove(forget func(cid string)) { j.forget = forget }

// NewJanitor returns a Janitor that sweeps on schedule.
func NewJanitor(folders *files.Folders, st Busy, sessionTTL, retention time.Duration, schedule lifecycle.Schedule, log *slog.Logger) *Janitor {
	return &Janitor{folders: folders, store: st, idle: 2 * sessionTTL, retention: retention, schedule: schedule,
		log: log.With("component", "janitor")}
}

// Start sweeps every JanitorInterval until Stop.
func (j *Janitor) Start(ctx context.Context) error {
	return j.Base.Run(ctx, j.schedule(JanitorInterval, j.Sweep))
}

// Sweep looks at every conversation once.
func (j *Janitor) Sweep(ctx context.Context) {
	convs, err := j.folders.Conversations()
	if err != nil {
		j.log.Warn("list conversations", "err", err)
		return
	}
	for _, c := range convs {
		idle := time.Since(c.LastUse)
		if idle < j.idle && (j.retention == 0 || idle < j.retention) {
			continue
		}
		busy, err := j.store.Busy(ctx, c.ID)
		if err != nil || busy {
			continue
		}
		// Under the conversation's lock, the folder's last use and the
		// store's busy flag are looked at again: a run may have started
		// since (its executor marks the use under the same lock).
		stillIdle := func(threshold time.Duration) func(time.Time) bool {
			return func(lastUse time.Time) bool {
				if time.Since(lastUse) < threshold {
					return false
				}
				busy, err := j.store.Busy(ctx, c.ID)
				return err == nil && !busy
			}
		}
		if j.retention > 0 && idle >= j.retention {
			if j.forget != nil {
				j.forget(c.ID)
			}
			if done, err := j.folders.RemoveIdle(c.ID, stillIdle(j.retention)); err != nil {
				j.log.Warn("remove expired conversation", "conversation", c.ID, "err", err)
			} else if done {
				j.log.Info("removed a conversation past its retention", "conversation", c.ID, "idle", idle.Round(time.Second))
			}
			continue
		}
		if _, err := j.folders.Release(c.ID, stillIdle(j.idle)); err != nil {
			j.log.Warn("release idle conversation", "conversation", c.ID, "err", err)
		}
	}
}
