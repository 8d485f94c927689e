package webhooks

import (
	"context"
	"time"

	"github.com/runbox-dev/runbox/internal/lifecycle"
)

// RelayInterval is how often the relay looks at the outbox.
const RelayInterval = 200 * time.Millisecond

// relayBatch bounds the webhooks one look moves.
const relayBatch = 100

// Relay moves the webhooks in the outbox into the queue. Every api
// runs one: each move is safe to repeat (the task's id is the webhook's),
// so a process that dies between making the task and taking the webhook
// out of the outbox leaves it to the next look, which makes no second
// task.
type Relay struct {
	lifecycle.Base
	s *Service
}

// NewRelay returns a Relay for s.
func NewRelay(s *Service) *Relay { return &Relay{s: s} }

// Start looks at the outbox at once and every RelayInterval until Stop.
func (r *Relay) Start(ctx context.Context) error {
	return r.Base.Run(ctx, func(ctx context.Context) {
		r.Pass(ctx)
		lifecycle.Every(r.s.o.Clock, RelayInterval, r.Pass)(ctx)
	})
}

// Pass moves what the outbox holds now.
func (r *Relay) Pass(ctx context.Context) {
	for ctx.Err() == nil {
		ids, err := r.s.store.Outbox(ctx, relayBatch)
		if err != nil {
			if ctx.Err() == nil {
				r.s.log.Warn("read the webhooks' outbox", "err", err)
			}
			return
		}
		for _, id := range ids {
			if _, err := r.s.tasks.Enqueue(ctx, id); err != nil {
				r.s.log.Warn("relay a webhook; the next look will", "webhook", id, "err", err)
				return
			}
			if err := r.s.store.Relayed(ctx, id, r.s.ttl()); err != nil {
				r.s.log.Warn("relay a webhook; the next look will", "webhook", id, "err", err)
				return
			}
		}
		if len(ids) < relayBatch {
			return
		}
	}
}
