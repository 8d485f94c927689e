package store

import (
	"context"
	"fmt"
)

// Conversations keeps what a conversation is beyond its runs: whether it
// is busy and when it is closed, the marks and claims of forks
// (forks.go), its files' versions in a shared file store (files.go), and
// its kept interpreter's state (state.go).
type Conversations struct{ *base }

// Busy reports whether a conversation has a run queued or running: a
// head, or live runs (parallel and detached ones hold no head).
func (s *Conversations) Busy(ctx context.Context, cid string) (bool, error) {
	n, err := s.rdb.Exists(ctx, conversationHeadKey(cid), conversationLiveKey(cid)).Result()
	if err != nil {
		return false, fmt.Errorf("read conversation %s: %w", cid, err)
	}
	return n > 0, nil
}

// PublishClosed tells the executors that a conversation was closed, so
// that they drop its warm sandboxes.
func (s *Conversations) PublishClosed(ctx context.Context, cid string) error {
	if err := s.rdb.Publish(ctx, closedChannel, cid).Err(); err != nil {
		return fmt.Errorf("announce closed conversation: %w", err)
	}
	return nil
}

// SubscribeClosed returns a subscription to closed conversations, once
// Redis confirmed it; each message is a conversation id. The caller
// closes it.
func (s *Conversations) SubscribeClosed(ctx context.Context) (*Subscription, error) {
	return s.conn.subscribe(ctx, closedChannel)
}
