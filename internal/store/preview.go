package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/runbox-dev/runbox"
)

// A preview URL names a record (preview.Capability): the conversation it
// was issued for, on which executor, and which of its sandboxes were alive
// then. It lives until the URL expires.

// PreviewRecord is what a preview URL stands for.
type PreviewRecord struct {
	Client       string `json:"client"`
	Conversation string `json:"conversation"` // its key
	Executor     string `json:"executor"`
	// Sandboxes are the conversation's sandboxes when the URL was issued:
	// the URL serves while one of them lives, and never another's.
	Sandboxes []string `json:"sandboxes"`
}

// ErrPreviewNotFound reports a preview record that does not exist (or has
// expired).
var ErrPreviewNotFound = runbox.Errorf(runbox.ENotFound, "no such preview")

// SavePreview records preview id until expires.
func (s *Store) SavePreview(ctx context.Context, id string, rec PreviewRecord, expires time.Time) error {
	b, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	if err := s.rdb.Set(ctx, previewKey(id), b, time.Until(expires)).Err(); err != nil {
		return fmt.Errorf("record preview: %w", err)
	}
	return nil
}

// Preview returns the record of preview id.
func (s *Store) Preview(ctx context.Context, id string) (PreviewRecord, error) {
	var rec PreviewRecord
	b, err := s.rdb.Get(ctx, previewKey(id)).Bytes()
	if errors.Is(err, redis.Nil) {
		return rec, ErrPreviewNotFound
	}
	if err != nil {
		return rec, fmt.Errorf("read preview: %w", err)
	}
	if err := json.Unmarshal(b, &rec); err != nil {
		return rec, fmt.Errorf("read preview: %w", err)
	}
	return rec, nil
}

// ErrExecutorGone reports an executor whose heartbeat lapsed.
var ErrExecutorGone = errors.New("store: executor is gone")

// ExecutorInfo returns what a live executor announced about itself.
func (s *Store) ExecutorInfo(ctx context.Context, id string) (ExecutorInfo, error) {
	var info ExecutorInfo
	b, err := s.rdb.Get(ctx, executorKey(id)).Bytes()
	if errors.Is(err, redis.Nil) {
		return info, ErrExecutorGone
	}
	if err != nil {
		return info, fmt.Errorf("read executor %s: %w", id, err)
	}
	if err := json.Unmarshal(b, &info); err != nil {
		return info, fmt.Errorf("read executor %s: %w", id, err)
	}
	return info, nil
}
