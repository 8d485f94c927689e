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
	// PackagesDir, at the top of a conversation's folder, holds the
	// packages its runs installed: counted in its quota, left out of its
	// listings (a run's files and artifacts are what programs wrote).
	PackagesDir = ".packages"
)

// Folders are the conversations' folders under one root.
type Folders struct {
	root     string
	uid, gid int
	quota    int64
	space    space
	fallback error // why auto mode walks (QuotaFallback)
}

// Options configure Folders.
type Options struct {
	// UID and GID own the files: the sandbox user.
	UID, GID int
	// Quota bounds the bytes of one conversation's files.
	Quota int64
	// Files bounds the entries of one conversation's files in walk mode
	// (a loop-mounted image has its own inode count); 0 is no bound.
	Files int
	Mode  QuotaMode
}

// NewFolders uses root (created if missing) for conversation folders.
func NewFolders(root string, opts Options) (*Folders, error) {
	if err := os.MkdirAll(root, 0o711); err != nil {
		return nil, fmt.Errorf("create sandbox root: %w", err)
	}
	sp, fallback, err := newSpace(opts.Mode, root, opts.Quota, opts.Files, opts.UID, opts.GID)
	if err != nil {
		return nil, err
	}
	return &Folders{root: root, uid: opts.UID, gid: opts.GID, quota: opts.Quota, space: sp, fallback: fallback}, nil
}

// QuotaFallback returns why the auto quota mode measures folders rather
// than mounting images (nil where it mounts them, or the mode was set).
func (f *Folders) QuotaFallback() error { return f.fallback }

// Root returns the folder all conversations live under.
func (f *Folders) Root() string { return f.root }

// HardQuota reports whether the kernel holds conversations to their quota
// (loop-mounted images), rather than the executor's checks.
func (f *Folders) HardQuota() bool { return f.space.hard() }

// Quota returns the bytes one conversation's files may take.
func (f *Folders) Quota() int64 { return f.quota }

func (f *Folders) convDir(cid string) string { return filepath.Join(f.root, cid) }

// Path returns the host path of a conversation's files, the sandbox's
// /data. The id must be valid.
func (f *Folders) Path(cid string) string { return filepath.Join(f.root, cid, "files") }

// lockValid checks a conversation id and holds its lock.
func (f *Folders) lockValid(cid string) (unlock func(), err error) {
	if !runbox.ValidConversationKey(cid) {
		return nil, runbox.Errorf(runbox.EInvalid, "invalid conversationId")
	}
	return f.lock(cid)
}

// lock holds a conversation's lock file, across processes, until unlock.
func (f *Folders) lock(cid string) (unlock func(), err error) {
	if err := os.MkdirAll(f.convDir(cid), 0o711); err != nil {
		return nil, fmt.Errorf("create conversation folder: %w", err)
	}
	lf, err := os.OpenFile(filepath.Join(f.convDir(cid), ".lock"), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("lock conversation: %w", err)
	}
	if err := syscall.Flock(int(lf.Fd()), syscall.LOCK_EX); err != nil {
		lf.Close()
		return nil, fmt.Errorf("lock conversation: %w", err)
	}
	return func() { lf.Close() }, nil
}

// Ensure makes a conversation's folder ready for use, writable by the
// sandbox user and bounded by the quota, marks it used now, and returns
// its host path.
func (f *Folders) Ensure(cid string) (string, error) {
	unlock, err := f.lockValid(cid)
	if err != nil {
		return "", err
	}
	defer unlock()
	return f.ensureLocked(cid)
}

// ensureLocked is Ensure for a caller that holds the conversation's lock.
func (f *Folders) ensureLocked(cid string) (string, error) {
	dir := f.Path(cid)
	if err := f.space.prepare(f.convDir(cid), dir); err != nil {
		return "", err
	}
	// Again at each use: a mount, or a hand-over's image, holds no room
	// until told (space.reserve).
	if err := f.space.reserve(dir, f.stateSize(cid)); err != nil {
		return "", err
	}
	now := time.Now()
	_ = os.Chtimes(f.convDir(cid), now, now) // last use, for retention
	return dir, nil
}

// remount puts back the disk image of a conversation the janitor
// released, so that a read (a listing, a download) sees its files rather
// than the empty folder under the mount. A conversation with no image is
// left as it is: reading never creates one.
func (f *Folders) remount(cid string) error {
	if !f.space.hard() {
		return nil
	}
	if _, err := os.Stat(filepath.Join(f.convDir(cid), "files.img")); err != nil {
		return nil
	}
	if mounted, err := isMountPoint(f.Path(cid)); err != nil || mounted {
		return err
	}
	_, err := f.Ensure(cid)
	return err
}

// Usage returns the bytes a conversation's files use and how many more
// they may.
func (f *Folders) Usage(cid string) (used, free int64, err error) {
	if !runbox.ValidConversationKey(cid) {
		return 0, 0, runbox.Errorf(runbox.EInvalid, "invalid conversationId")
	}
	if err := f.remount(cid); err != nil {
		return 0, 0, err
	}
	return f.usage(cid)
}

// StoredSize returns the bytes a conversation's files and saved state
// take where holes take room as data does — in a file store, in an
// archive: walk mode's measure (each entry its apparent size or its
// blocks, whichever is more), whatever the mode. A copy there of files
// past the quota by that measure is refused.
func (f *Folders) StoredSize(cid string) (int64, error) {
	if !runbox.ValidConversationKey(cid) {
		return 0, runbox.Errorf(runbox.EInvalid, "invalid conversationId")
	}
	if err := f.remount(cid); err != nil {
		return 0, err
	}
	m, err := measure(f.Path(cid), walkTime)
	return m.bytes + f.stateSize(cid), err
}

// usage is Usage of a conversation whose folder is mounted, if it has an
// image. A saved interpreter state counts too (state.go). In loop mode
// the image holds the state's room already (reserve), out of free; the
// bound leaves it out of free once, and where the kernel does not hold it
// (walk mode, an image not reserved yet) too.
func (f *Folders) usage(cid string) (used, free int64, err error) {
	used, free, err = f.space.usage(f.Path(cid))
	if err != nil {
		return 0, 0, err
	}
	state := f.stateSize(cid)
	return used + state, min(free, max(0, f.quota-used-state)), nil
}

// Remove deletes a conversation's files.
func (f *Folders) Remove(cid string) error {
	unlock, err := f.lockValid(cid)
	if err != nil {
		return err
	}
	defer unlock()
	if err := f.space.release(f.Path(cid)); err != nil {
		return err
	}
	if err := os.RemoveAll(f.convDir(cid)); err != nil {
		return fmt.Errorf("remove conversation folder: %w", err)
	}
	return f.removeState(cid)
}

// Release unmounts a conversation's files, if they are mounted, when idle
// still says so under the conversation's lock (which Ensure takes to mark
// a use): a conversation used since the caller looked is left alone.
func (f *Folders) Release(cid string, idle func(lastUse time.Time) bool) (bool, error) {
	return f.ifIdle(cid, idle, func() error { return f.space.release(f.Path(cid)) })
}

// RemoveIdle deletes a conversation's files when idle still says so under
// the conversation's lock.
func (f *Folders) RemoveIdle(cid string, idle func(lastUse time.Time) bool) (bool, error) {
	return f.ifIdle(cid, idle, func() error {
		if err := f.space.release(f.Path(cid)); err != nil {
			return err
		}
		if err := os.RemoveAll(f.convDir(cid)); err != nil {
			return fmt.Errorf("remove conversation folder: %w", err)
		}
		return f.removeState(cid)
	})
}

func (f *Folders) ifIdle(cid string, idle func(time.Time) bool, do func() error) (bool, error) {
	unlock, err := f.lockValid(cid)
	if err != nil {
		return false, err
	}
	defer unlock()
	info, err := os.Stat(f.convDir(cid))
	if err != nil {
		return false, fmt.Errorf("read conversation folder: %w", err)
	}
	if !idle(info.ModTime()) {
		return false, nil
	}
	return true, do()
}

// ClientUsage returns the bytes the conversations of a client take
// together.
func (f *Folders) ClientUsage(client string) (int64, error) {
	convs, err := f.Conversations()
	if err != nil {
		return 0, err
	}
	var total int64
	for _, c := range convs {
		if owner, _, _ := runbox.ParseConversationKey(c.ID); owner != client {
			continue
		}
		used, _, err := f.Usage(c.ID)
		if err != nil {
			return 0, err
		}
		total += used
	}
	return total, nil
}

// Conversation is a conversation folder and its last use.
type Conversation struct {
	ID      string
	LastUse time.Time
}

// Conversations lists the conversation folders.
func (f *Folders) Conversations() ([]Conversation, error) {
	entries, err := os.ReadDir(f.root)
	if err != nil {
		return nil, fmt.Errorf("list conversations: %w", err)
	}
	var out []Conversation
	for _, e := range entries {
		if !e.IsDir() || !runbox.ValidConversationKey(e.Name()) {
			continue
		}
		info, err := e.Info()
		if err != nil {
			continue
		}
		out = append(out, Conversation{ID: e.Name(), LastUse: info.ModTime()})
	}
	return out, nil
}

// Entry is a regular file in a conversation's folder.
type Entry = runbox.StoredFile

// List returns the regular files of a conversation, sorted by name.
// Symlinks and special files are left out; a missing folder has no files.
func (f *Folders) List(cid string) ([]Entry, error) {
	if !runbox.ValidConversationKey(cid) {
		return nil, runbox.Errorf(runbox.EInvalid, "invalid conversationId")
	}
	if err := f.remount(cid); err != nil {
		return nil, err
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
			if p == PackagesDir || p != "." && strings.Count(p, "/") >= runbox.MaxListDepth {
				return fs.SkipDir
			}
			return nil
		}
		if !d.Type().IsRegular() || strings.HasPrefix(path.Base(p), UploadPrefix) {
			return nil
		}
		info, err := d.Info()
		if err != nil {
			return nil
		}
		out = append(out, Entry{Name: p, Size: info.Size(), ModTime: info.ModTime()})
		if len(out) >= runbox.MaxListEntries {
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

// Open opens a regular file of a conversation for reading. It never follows
// a link out of the folder and never opens anything but a regular file (a
// FIFO would block the reader).
func (f *Folders) Open(cid, name string) (*os.File, fs.FileInfo, error) {
	if !runbox.ValidConversationKey(cid) {
		return nil, nil, runbox.Errorf(runbox.EInvalid, "invalid conversationId")
	}
	name, err := runbox.CleanFileName(name)
	if err != nil {
		return nil, nil, err
	}
	if err := f.remount(cid); err != nil {
		return nil, nil, err
	}
	root, err := os.OpenRoot(f.Path(cid))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil, runbox.ErrFileNotFound
	}
	if err != nil {
		return nil, nil, fmt.Errorf("open conversation folder: %w", err)
	}
	defer root.Close()
	file, err := root.OpenFile(name, os.O_RDONLY|syscall.O_NONBLOCK|syscall.O_NOFOLLOW, 0)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ELOOP) || isEscape(err) {
			return nil, nil, runbox.ErrFileNotFound
		}
		return nil, nil, fmt.Errorf("open file: %w", err)
	}
	info, err := file.Stat()
	if err != nil || !info.Mode().IsRegular() {
		file.Close()
		return nil, nil, runbox.ErrFileNotFound
	}
	return file, info, nil
}

// isEscape reports os.Root's refusal of a path that leaves the root.
func isEscape(err error) bool {
	var pe *fs.PathError
	return errors.As(err, &pe) && strings.Contains(pe.Err.Error(), "escapes")
}
