package runbox

import (
	"context"
	"io"
	"path"
	"regexp"
	"strings"
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

// What every file store refuses, and says so alike.
var (
	// ErrFileNotFound reports a file that does not exist or is not a
	// regular file.
	ErrFileNotFound = Errorf(ENotFound, "no such file")
	// ErrFileName reports an upload's name that ValidFileName refuses.
	ErrFileName = Errorf(EInvalidPath,
		"file names may hold only letters, digits, '.', '_' and '-', may not start with a dot, and have at most 255 bytes")
	// ErrForkExists reports a fork's target that has files already.
	ErrForkExists = Errorf(EConversationExists, "a conversation of that id exists already")
)

// FileExistsError reports an upload whose name is taken.
func FileExistsError(name string) error {
	return Errorf(EFileExists, "%s exists; pass overwrite to replace it", name)
}

// FileTooLargeError reports an upload over the limit.
func FileTooLargeError(limit int64) error {
	return Errorf(ETooLarge, "the file is larger than the limit of %d bytes", limit)
}

// FileQuotaError reports a write that would take a conversation past its
// quota.
func FileQuotaError(quota int64) error {
	return Errorf(EQuotaExceeded, "the conversation's files would exceed its quota of %d bytes", quota)
}

// A listing of a conversation's files is bounded, whatever the store: a
// program may write millions of files, and nest them deep.
const (
	MaxListEntries = 1000
	MaxListDepth   = 8
)

var fileNamePattern = regexp.MustCompile(`^[A-Za-z0-9_-][A-Za-z0-9._-]{0,254}$`)

// ValidFileName reports whether name may name an uploaded file: letters,
// digits, '.', '_' and '-', not starting with a dot, at most 255 bytes. Such
// a name is one path element and never a hidden or special one.
func ValidFileName(name string) bool { return fileNamePattern.MatchString(name) }

// CleanFileName checks a slash-separated path relative to /data (a name
// from a listing or a store's key, or a client's "path" with or without
// /data/ or /mnt/data/, the same folder in every sandbox) and returns it
// clean.
func CleanFileName(name string) (string, error) {
	if rest, ok := strings.CutPrefix(name, "/mnt/data/"); ok {
		name = rest
	} else {
		name = strings.TrimPrefix(name, "/data/")
	}
	bad := name == "" || len(name) > 1024 || strings.ContainsRune(name, 0) ||
		strings.HasPrefix(name, "/") || strings.Contains(name, "\\")
	if !bad {
		for seg := range strings.SplitSeq(name, "/") {
			if seg == "" || seg == "." || seg == ".." {
				bad = true
				break
			}
		}
	}
	if bad || path.Clean(name) != name {
		return "", Errorf(EInvalidPath, "invalid file path")
	}
	return name, nil
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
