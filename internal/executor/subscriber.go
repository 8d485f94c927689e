package executor

import (
	"context"
	"log/slog"

	"github.com/redis/go-redis/v9"

	"github.com/runbox-dev/runbox/internal/lifecycle"
)

// subscriber hands each message of a Redis channel to handle: the
// cancellations clients ask for, the conversations they close.
type subscriber struct {
	lifecycle.Base
	name      string
	subscribe func(context.Context) *redis.PubSub
	handle    func(payload string)
	log       *slog.Logger
}

// Start subscribes before it returns, so that no message published after
// the start is missed.
func (s *subscriber) Start(ctx context.Context) error {
	sub := s.subscribe(ctx)
	if _, err := sub.Receive(ctx); err != nil {
		sub.Close()
		return err
	}
	return s.Base.Run(ctx, func(ctx context.Context) {
		defer sub.Close()
		ch := sub.Channel()
		for {
			select {
			case <-ctx.Done():
				return
			case msg, ok := <-ch:
				if !ok {
					s.log.Warn("subscription ended", "subscription", s.name)
					return
				}
				s.handle(msg.Payload)
			}
		}
	})
}
