package workcopy

import (
	"context"
	"io"
	"time"

	"github.com/runbox-dev/runbox"
	"github.com/runbox-dev/runbox/internal/store"
)

// Versioned is the api's view of a remote file store: every change it
// makes (an upload, a close) takes a new version, so that executors'
// copies see it at their next run, and marks the conversation's use for
// the store's retention.
type Versioned struct {
	runbox.FileStore
	versions *store.Store
}

// NewVersioned records the changes made through fs in versions.
func NewVersioned(fs runbox.FileStore, versions *store.Store) Versioned {
	return Versioned{FileStore: fs, versions: versions}
}

func (v Versioned) Write(ctx context.Context, conv, name string, r io.Reader, limit int64, overwrite bool) (runbox.StoredFile, error) {
	f, err := v.FileStore.Write(ctx, conv, name, r, limit, overwrite)
	if err != nil {
		return f, err
	}
	_, _, err = v.versions.FilesChanged(ctx, conv, -1, time.Now())
	return f, err
}

func (v Versioned) Remove(ctx context.Context, conv string) error {
	if err := v.FileStore.Remove(ctx, conv); err != nil {
		return err
	}
	return v.versions.FilesRemoved(ctx, conv)
}
