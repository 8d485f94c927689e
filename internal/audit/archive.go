package audit

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"regexp"
)

// Archive keeps the segments of the log that left Redis: the log keeps
// its promise (nothing lost, the chain verifiable) under a bound on what
// Redis holds. It is the deployment's file store: a folder beside the
// conversations (DirArchive), or the S3 bucket (s3store.Archive).
type Archive interface {
	// Put stores a segment whole, replacing one of the same name.
	Put(ctx context.Context, name string, data []byte) error
	// Get returns a segment; a missing one is fs.ErrNotExist.
	Get(ctx context.Context, name string) ([]byte, error)
	// Remove deletes a segment; a missing one is not an error.
	Remove(ctx context.Context, name string) error
}

// Segment is an entry of the index of the archive, which Redis keeps in
// order: the segment's name and the entries it holds.
type Segment struct {
	Name     string `json:"name"`
	First    int64  `json:"first"` // seq
	Last     int64  `json:"last"`
	LastHash string `json:"last_hash"`
	// LastTime is the time of its newest entry: the segment leaves with
	// retention once that is past.
	LastTime string `json:"last_time"`
}

// segmentName names the segment of entries first..last; names sort as
// the segments do.
func segmentName(first, last int64) string {
	return fmt.Sprintf("audit-%020d-%020d.jsonl", first, last)
}

// validSegmentName is the only form of name an archive stores.
var validSegmentName = regexp.MustCompile(`^audit-[0-9]{20}-[0-9]{20}\.jsonl$`)

// DirArchive keeps segments in a folder of the host
// (SANDBOX_ROOT/.audit), opened through os.Root.
type DirArchive struct{ dir string }

// NewDirArchive returns the archive in dir, made if missing.
func NewDirArchive(dir string) (*DirArchive, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("audit archive: %w", err)
	}
	return &DirArchive{dir: dir}, nil
}

func (d *DirArchive) open(name string) (*os.Root, error) {
	if !validSegmentName.MatchString(name) {
		return nil, fmt.Errorf("audit archive: %q is not a segment's name", name)
	}
	return os.OpenRoot(d.dir)
}

// Put writes the segment to a temporary file, syncs it and renames it
// into place: a segment is there whole or not at all.
func (d *DirArchive) Put(_ context.Context, name string, data []byte) error {
	root, err := d.open(name)
	if err != nil {
		return err
	}
	defer root.Close()
	tmp := "." + name + ".tmp"
	f, err := root.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		return fmt.Errorf("audit archive: %w", err)
	}
	_, werr := f.Write(data)
	serr := f.Sync()
	if err := errors.Join(werr, serr, f.Close()); err != nil {
		_ = root.Remove(tmp)
		return fmt.Errorf("audit archive: write %s: %w", name, err)
	}
	if err := root.Rename(tmp, name); err != nil {
		_ = root.Remove(tmp)
		return fmt.Errorf("audit archive: %w", err)
	}
	if dir, err := os.Open(d.dir); err == nil {
		_ = dir.Sync()
		dir.Close()
	}
	return nil
}

func (d *DirArchive) Get(_ context.Context, name string) ([]byte, error) {
	root, err := d.open(name)
	if err != nil {
		return nil, err
	}
	defer root.Close()
	b, err := root.ReadFile(name)
	if err != nil {
		return nil, fmt.Errorf("audit archive: %w", err)
	}
	return b, nil
}

func (d *DirArchive) Remove(_ context.Context, name string) error {
	root, err := d.open(name)
	if err != nil {
		return err
	}
	defer root.Close()
	if err := root.Remove(name); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("audit archive: %w", err)
	}
	return nil
}
