package executor

import (
	"context"
	"log/slog"

	"github.com/runbox-dev/runbox/internal/lifecycle"
	"github.com/runbox-dev/runbox/internal/store"
)

// subscriber hands each message of a Redis channel to handle: the
// cancellations clients ask for, the conversations they close.
type subscriber struct {
	lifecycle.Base
	name      string
	subscribe func(context.Context) (*store.Subscription, error)
	handle    func(payload string)
	log       *slog.Logger
}

// Start subscribes before it returns, so that no message published after
// the start is missed.
func (s *subscriber) Start(ctx context.Context) error {
	sub, err := s.subscribe(ctx)
	if err != nil {
		return err
	}
	return s.Base.Run(ctx, func(ctx context.Context) {
		defer sub.Close()
		for {
			msg, err := sub.Next(ctx)
			if err != nil {
				if ctx.Err() == nil {
					s.log.Warn("subscription ended", "subscription", s.name, "err", err)
				}
				return
			}
			s.handle(msg)
		}
	})
}
