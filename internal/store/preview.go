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

// Previews keeps the records of preview URLs.
type Previews struct{ *base }

// A preview URL names a record (preview.Capability): the conversation it
// was issued for, on which executor, and which of its sandboxes were alive
// then. It lives until the URL expires.

// SavePreview records preview id until expires.
func (s *Previews) SavePreview(ctx context.Context, id string, rec runbox.PreviewRecord, expires time.Time) error {
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
func (s *Previews) Preview(ctx context.Context, id string) (runbox.PreviewRecord, error) {
	var rec runbox.PreviewRecord
	b, err := s.rdb.Get(ctx, previewKey(id)).Bytes()
	if errors.Is(err, redis.Nil) {
		return rec, runbox.ErrPreviewNotFound
	}
	if err != nil {
		return rec, fmt.Errorf("read preview: %w", err)
	}
	if err := json.Unmarshal(b, &rec); err != nil {
		return rec, fmt.Errorf("read preview: %w", err)
	}
	return rec, nil
}
