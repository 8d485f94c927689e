package runbox

import (
	"context"
	"io"
	"time"
)

// StoredFile is a regular file of a conversation, as a file store holds it.
type StoredFile struct {
	Name    string // slash-separated, relative to /data
	Size    int64
	ModTime time.Time
	// ETag names the content, where the store has one (S3); empty for the
	// host folder.
	ETag string
}

// FileStore holds conversations' files for the api: uploads go in,
// listings, reads and downloads come out. Its adapters are the host folder
// the sandboxes mount (internal/files) and S3-compatible storage
// (internal/s3store), where executors keep a working copy of each
// conversation they run. Conversations are named by their keys
// (ConversationKey); file names are clean (no "..", no leading '/').
type FileStore interface {
	// List returns a conversation's regular files, sorted by name; a
	// conversation without files has none.
	List(ctx context.Context, conv string) ([]StoredFile, error)
	// Open opens a file for reading; a missing file is ENotFound.
	Open(ctx context.Context, conv, name string) (io.ReadSeekCloser, StoredFile, error)
	// Write stores what r yields, at most limit bytes, as an uploaded file
	// (a single path element). It appears whole or not at all; without
	// overwrite an existing name is EFileExists.
	Write(ctx context.Context, conv, name string, r io.Reader, limit int64, overwrite bool) (StoredFile, error)
	// Exists reports whether a conversation has files.
	Exists(ctx context.Context, conv string) (bool, error)
	// Remove deletes a conversation's files.
	Remove(ctx context.Context, conv string) error
	// ClientUsage returns the bytes a client's conversations take.
	ClientUsage(ctx context.Context, client string) (int64, error)
	// Usage returns the bytes a conversation's files take, as its quota
	// counts them.
	Usage(ctx context.Context, conv string) (int64, error)
	// Fork copies every file of conversation src (installed packages too,
	// where the store holds them) into dst, which must have none
	// (EConversationExists otherwise). The copy shares the source's
	// storage where the store can (reflinks, server-side copies), and
	// later writes to either never show in the other. It is whole or not
	// at all: a fork that fails leaves nothing of dst.
	Fork(ctx context.Context, src, dst string) (Forked, error)
}

// Forked is what a fork copied.
type Forked struct {
	Files int   // regular files copied
	Bytes int64 // their size
	// Cloned counts the files copied without their bytes passing through
	// the service: reflinks on the host, server-side copies on S3.
	Cloned int
	// Packages: the store holds the conversation's installed packages, and
	// they were copied with its files.
	Packages bool
}
