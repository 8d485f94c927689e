package store

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/redis/go-redis/v9"

	"github.com/runbox-dev/runbox"
	"github.com/runbox-dev/runbox/internal/store/internal/keys"
)

// Heads returns the conversations that have a head, and their heads.
func (s *Store) Heads(ctx context.Context) ([]runbox.ConversationHead, error) {
	var heads []runbox.ConversationHead
	iter := s.rdb.SScan(ctx, busyConvsKey, 0, "", 200).Iterator()
	for iter.Next(ctx) {
		cid := iter.Val()
		run, err := s.rdb.Get(ctx, conversationHeadKey(cid)).Result()
		if errors.Is(err, redis.Nil) {
			// Idle: the set is only a hint.
			s.rdb.SRem(ctx, busyConvsKey, cid)
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("read conversation heads: %w", err)
		}
		heads = append(heads, runbox.ConversationHead{Conversation: cid, Run: run})
	}
	if err := iter.Err(); err != nil {
		return nil, fmt.Errorf("read conversation heads: %w", err)
	}
	return heads, nil
}

// Advance moves a conversation past head, which ended, and returns the run
// that heads it now ("" if none). It does nothing if head is not the head.
func (s *Store) Advance(ctx context.Context, h runbox.ConversationHead) (string, error) {
	next, err := advanceScript.Run(ctx, s.rdb, []string{
		conversationHeadKey(h.Conversation), conversationPendingKey(h.Conversation), busyConvsKey,
	}, h.Run, h.Conversation).Text()
	if err != nil {
		return "", fmt.Errorf("advance conversation %s: %w", h.Conversation, err)
	}
	return next, nil
}

// Runs returns up to n runs, newest first: those of the conversation key
// cid, or with cid "", the client's most recent.
func (s *Store) Runs(ctx context.Context, client, cid string, n int) ([]runbox.Run, error) {
	return s.RunsWhere(ctx, client, cid, n, nil)
}

// RunsWhere is Runs of the runs keep keeps (nil: all): it reads on, past
// the runs left out, until it has n or there are no more.
func (s *Store) RunsWhere(ctx context.Context, client, cid string, n int, keep func(runbox.Run) bool) ([]runbox.Run, error) {
	key := clientRunsKey(client)
	if cid != "" {
		key = conversationRunsKey(cid)
	}
	runs := make([]runbox.Run, 0, n)
	for start := int64(0); len(runs) < n; start += int64(n) {
		ids, err := s.rdb.ZRevRange(ctx, key, start, start+int64(n)-1).Result()
		if err != nil {
			return nil, fmt.Errorf("list runs: %w", err)
		}
		for _, id := range ids {
			run, err := s.Run(ctx, id)
			if errors.Is(err, runbox.ErrRunNotFound) {
				continue // expired
			}
			if err != nil {
				return nil, err
			}
			if keep != nil && !keep(run) {
				continue
			}
			run.Result = nil
			if runs = append(runs, run); len(runs) == n {
				break
			}
		}
		if len(ids) < n {
			break
		}
	}
	return runs, nil
}

// Values of a run's cancel flag; a graceful request's message carries
// termSuffix after the run id.
const (
	cancelKill = "1"
	cancelTerm = "term"
	termSuffix = " " + cancelTerm
)

// RequestCancel flags a run for cancellation and tells the executors, one
// of which may be running it.
func (s *Store) RequestCancel(ctx context.Context, id string, graceful bool) error {
	flag, msg := cancelKill, id
	if graceful {
		flag, msg = cancelTerm, id+termSuffix
	}
	pipe := s.rdb.TxPipeline()
	pipe.HSet(ctx, keys.Run(id), cancelFlagField, flag)
	pipe.Publish(ctx, cancelChannel, msg)
	if _, err := pipe.Exec(ctx); err != nil {
		return fmt.Errorf("cancel run %s: %w", id, err)
	}
	return nil
}

// ParseCancel reads a message of SubscribeCancels.
func ParseCancel(msg string) runbox.CancelRequest {
	id, graceful := strings.CutSuffix(msg, termSuffix)
	return runbox.CancelRequest{ID: id, Graceful: graceful}
}

// CancelRequested reports which of ids were flagged for cancellation.
func (s *Store) CancelRequested(ctx context.Context, ids ...string) ([]runbox.CancelRequest, error) {
	pipe := s.rdb.Pipeline()
	cmds := make([]*redis.StringCmd, len(ids))
	for i, id := range ids {
		cmds[i] = pipe.HGet(ctx, keys.Run(id), cancelFlagField)
	}
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return nil, fmt.Errorf("read cancel flags: %w", err)
	}
	var out []runbox.CancelRequest
	for i, c := range cmds {
		if v := c.Val(); v == cancelKill || v == cancelTerm {
			out = append(out, runbox.CancelRequest{ID: ids[i], Graceful: v == cancelTerm})
		}
	}
	return out, nil
}

// SubscribeCancels returns a subscription to cancellation requests, once
// Redis confirmed it; each message is one ParseCancel reads. The caller
// closes it.
func (s *Store) SubscribeCancels(ctx context.Context) (*Subscription, error) {
	return s.conn.subscribe(ctx, cancelChannel)
}

// Busy reports whether a conversation has a run queued or running: a
// head, or live runs (parallel and detached ones hold no head).
func (s *Store) Busy(ctx context.Context, cid string) (bool, error) {
	n, err := s.rdb.Exists(ctx, conversationHeadKey(cid), conversationLiveKey(cid)).Result()
	if err != nil {
		return false, fmt.Errorf("read conversation %s: %w", cid, err)
	}
	return n > 0, nil
}

// PublishClosed tells the executors that a conversation was closed, so
// that they drop its warm sandboxes.
func (s *Store) PublishClosed(ctx context.Context, cid string) error {
	if err := s.rdb.Publish(ctx, closedChannel, cid).Err(); err != nil {
		return fmt.Errorf("announce closed conversation: %w", err)
	}
	return nil
}

// SubscribeClosed returns a subscription to closed conversations, once
// Redis confirmed it; each message is a conversation id. The caller
// closes it.
func (s *Store) SubscribeClosed(ctx context.Context) (*Subscription, error) {
	return s.conn.subscribe(ctx, closedChannel)
}
