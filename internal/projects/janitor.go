package projects

import (
	"context"
	"errors"
	"log/slog"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/runbox-dev/runbox"
	"github.com/runbox-dev/runbox/internal/auth"
	"github.com/runbox-dev/runbox/internal/clients"
	"github.com/runbox-dev/runbox/internal/conversations"
	"github.com/runbox-dev/runbox/internal/lifecycle"
)

// JanitorInterval is how often expired projects are destroyed.
const JanitorInterval = 30 * time.Second

// Janitor destroys the projects whose time is over, as close_session
// would: their runs cancelled (the dev server, its sandbox with it) and
// their files deleted. It runs in the leader (Schedule).
type Janitor struct {
	lifecycle.Base
	store    Expiry
	convs    *conversations.Service
	schedule lifecycle.Schedule
	clock    clockwork.Clock
	log      *slog.Logger
}

// Expiry lists and removes the projects whose time is over
// (store.Projects).
type Expiry interface {
	ExpiredProjects(ctx context.Context, now time.Time, n int64) ([]string, error)
	RemoveProject(ctx context.Context, cid string) error
}

// NewJanitor returns a Janitor.
func NewJanitor(st Expiry, convs *conversations.Service, schedule lifecycle.Schedule, clock clockwork.Clock, log *slog.Logger) *Janitor {
	return &Janitor{store: st, convs: convs, schedule: schedule, clock: clock, log: log.With("component", "projects")}
}

// Start runs the sweep every JanitorInterval while scheduled.
func (j *Janitor) Start(ctx context.Context) error {
	return j.Base.Run(ctx, j.schedule(JanitorInterval, j.Sweep))
}

// Sweep destroys the projects expired by now.
func (j *Janitor) Sweep(ctx context.Context) {
	keys, err := j.store.ExpiredProjects(ctx, j.clock.Now(), 100)
	if err != nil {
		j.log.Warn("read expired projects", "err", err)
		return
	}
	for _, key := range keys {
		client, id, ok := runbox.ParseConversationKey(key)
		if ok {
			// As its client would close it: the conversation is named,
			// and its runs are found, as the client's.
			cctx := auth.WithClient(ctx, clients.Client{Name: client})
			if err := j.convs.Close(cctx, id); err != nil && !errors.Is(err, conversations.ErrClosed) {
				j.log.Warn("destroy an expired project", "conversation", key, "err", err)
				continue
			}
		}
		if err := j.store.RemoveProject(ctx, key); err != nil {
			j.log.Warn("forget an expired project", "conversation", key, "err", err)
			continue
		}
		j.log.Info("destroyed an expired project", "conversation", key)
	}
}
