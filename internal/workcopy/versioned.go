package workcopy

import (
	"context"
	"io"
	"time"

	"github.com/runbox-dev/runbox"
)

// Versioned is the api's view of a remote file store: every change it
// makes (an upload, a close) takes a new version, so that executors'
// copies see it at their next run, and marks the conversation's use for
// the store's retention.
type Versioned struct {
	runbox.FileStore
	versions Versions
}

// NewVersioned records the changes made through fs in versions.
func NewVersioned(fs runbox.FileStore, versions Versions) Versioned {
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

// Fork takes a version for the fork's files, and so marks its first use
// for the store's retention.
func (v Versioned) Fork(ctx context.Context, src, dst string) (runbox.Forked, error) {
	done, err := v.FileStore.Fork(ctx, src, dst)
	if err != nil {
		return done, err
	}
	_, _, err = v.versions.FilesChanged(ctx, dst, -1, time.Now())
	return done, err
}
