// Package files manages conversations' folders on the host, which are the
// /data of their sandboxes, and the signed URLs files are downloaded by.
//
// What is in a folder was written by untrusted code. Every path is resolved
// through os.Root, so no symlink and no ".." leads out of a conversation's
// folder, and only regular files are ever opened.
package files

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/runbox-dev/runbox"
)

const (
	// maxEntries bounds a listing: a program may write millions of files.
	maxEntries = 1000
	// maxDepth bounds how deep a listing descends.
	maxDepth = 8
)

// ErrNotFound reports a file that does not exist or is not a regular file.
var ErrNotFound = runbox.Errorf(runbox.ENotFound, "no such file")

// Folders are the conversations' folders under one root.
type Folders struct {
	root     string
	uid, gid int
}

// NewFolders uses root (created if missing) for conversation folders whose
// files belong to uid:gid, the sandbox user.
func NewFolders(root string, uid, gid int) (*Folders, error) {
	if err := os.MkdirAll(root, 0o711); err != nil {
		return nil, fmt.Errorf("create sandbox root: %w", err)
	}
	return &Folders{root: root, uid: uid, gid: gid}, nil
}

// Root returns the folder all conversations live under.
func (f *Folders) Root() string { return f.root }

// Path returns the host path of a conversation's files, the sandbox's
// /data. The id must be valid.
func (f *Folders) Path(cid string) string { return filepath.Join(f.root, cid, "files") }

// Ensure creates a conversation's folder, writable by the sandbox user, and
// returns its host path.
func (f *Folders) Ensure(cid string) (string, error) {
	if !runbox.ValidConversationID(cid) {
		return "", runbox.Errorf(runbox.EInvalid, "invalid conversationId")
	}
	dir := f.Path(cid)
	if err := os.MkdirAll(filepath.Dir(dir), 0o711); err != nil {
		return "", fmt.Errorf("create conversation folder: %w", err)
	}
	switch err := os.Mkdir(dir, 0o755); {
	case err == nil:
		if err := os.Lchown(dir, f.uid, f.gid); err != nil {
			// Not root: let the sandbox user write anyway.
			if err := os.Chmod(dir, 0o777); err != nil {
				return "", fmt.Errorf("open conversation folder to the sandbox: %w", err)
			}
		}
	case errors.Is(err, fs.ErrExist):
	default:
		return "", fmt.Errorf("create conversation folder: %w", err)
	}
	return dir, nil
}

// Entry is a regular file in a conversation's folder.
type Entry struct {
	Name    string // slash-separated, relative to /data
	Size    int64
	ModTime time.Time
}

// List returns the regular files of a conversation, sorted by name.
// Symlinks and special files are left out; a missing folder has no files.
func (f *Folders) List(cid string) ([]Entry, error) {
	if !runbox.ValidConversationID(cid) {
		return nil, runbox.Errorf(runbox.EInvalid, "invalid conversationId")
	}
	root, err := os.OpenRoot(f.Path(cid))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("open conversation folder: %w", err)
	}
	defer root.Close()
	var out []Entry
	err = fs.WalkDir(root.FS(), ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if p == "." {
				return err
			}
			return nil // unreadable entries are not listed
		}
		if d.IsDir() {
			if p != "." && strings.Count(p, "/") >= maxDepth {
				return fs.SkipDir
			}
			return nil
		}
		if !d.Type().IsRegular() {
			return nil
		}
		info, err := d.Info()
		if err != nil {
			return nil
		}
		out = append(out, Entry{Name: p, Size: info.Size(), ModTime: info.ModTime()})
		if len(out) >= maxEntries {
			return fs.SkipAll
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("list conversation folder: %w", err)
	}
	slices.SortFunc(out, func(a, b Entry) int { return strings.Compare(a.Name, b.Name) })
	return out, nil
}

// Changed returns the entries of after that are not in before, or differ in
// size or modification time: what a run wrote.
func Changed(before, after []Entry) []Entry {
	old := make(map[string]Entry, len(before))
	for _, e := range before {
		old[e.Name] = e
	}
	var out []Entry
	for _, e := range after {
		if o, ok := old[e.Name]; !ok || o.Size != e.Size || !o.ModTime.Equal(e.ModTime) {
			out = append(out, e)
		}
	}
	return out
}

// CleanName checks a slash-separated path relative to /data (a name from a
// listing, or a client's "path" with or without /data/) and returns it
// clean.
func CleanName(name string) (string, error) {
	name = strings.TrimPrefix(name, "/data/")
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
		return "", runbox.Errorf(runbox.EInvalidPath, "invalid file path")
	}
	return name, nil
}

// Open opens a regular file of a conversation for reading. It never follows
// a link out of the folder and never opens anything but a regular file (a
// FIFO would block the reader).
func (f *Folders) Open(cid, name string) (*os.File, fs.FileInfo, error) {
	if !runbox.ValidConversationID(cid) {
		return nil, nil, runbox.Errorf(runbox.EInvalid, "invalid conversationId")
	}
	name, err := CleanName(name)
	if err != nil {
		return nil, nil, err
	}
	root, err := os.OpenRoot(f.Path(cid))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil, ErrNotFound
	}
	if err != nil {
		return nil, nil, fmt.Errorf("open conversation folder: %w", err)
	}
	defer root.Close()
	file, err := root.OpenFile(name, os.O_RDONLY|syscall.O_NONBLOCK|syscall.O_NOFOLLOW, 0)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ELOOP) || isEscape(err) {
			return nil, nil, ErrNotFound
		}
		return nil, nil, fmt.Errorf("open file: %w", err)
	}
	info, err := file.Stat()
	if err != nil || !info.Mode().IsRegular() {
		file.Close()
		return nil, nil, ErrNotFound
	}
	return file, info, nil
}

// isEscape reports os.Root's refusal of a path that leaves the root.
func isEscape(err error) bool {
	var pe *fs.PathError
	return errors.As(err, &pe) && strings.Contains(pe.Err.Error(), "escapes")
}
