package sessions

import (
	"context"
	"time"

	"github.com/runbox-dev/runbox/internal/lifecycle"
)

// JanitorInterval is how often idle sessions are looked for.
const JanitorInterval = 30 * time.Second

// janitorBatch bounds the sessions one sweep ends; the next sweep takes
// the rest.
const janitorBatch = 100

// Janitor ends sessions idle past their TTL: their executions are
// cancelled and their folder removed, as the session's end does.
type Janitor struct {
	lifecycle.Base
	sessions *Service
	schedule lifecycle.Schedule
}

// NewJanitor returns a Janitor that sweeps on schedule (the leader's).
func NewJanitor(s *Service, schedule lifecycle.Schedule) *Janitor {
	return &Janitor{sessions: s, schedule: schedule}
}

// Start sweeps every JanitorInterval until Stop.
func (j *Janitor) Start(ctx context.Context) error {
	return j.Base.Run(ctx, j.schedule(JanitorInterval, func(ctx context.Context) { j.sessions.EndIdle(ctx, janitorBatch) }))
}
