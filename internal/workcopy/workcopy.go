// Package workcopy keeps an executor's working copies of conversations
// whose files live in a remote file store (S3). The sandbox mounts the
// copy, a folder like any other (quota and all); before a run the copy is
// brought up to the store's version, and before the run's done what the
// run changed goes back.
//
// A copy is current when it was made at the version Redis holds for the
// conversation (store.FilesVersion): a warm run costs one GET. Otherwise
// the store is listed, and each file whose content (ETag) or local size
// and time differ from what this executor last fetched or pushed is
// fetched again; files the store no longer has are removed.
package workcopy

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"path"
	"strings"
	"sync"
	"syscall"
	"time"
	"unicode/utf8"

	"github.com/runbox-dev/runbox"
	"github.com/runbox-dev/runbox/internal/files"
	"github.com/runbox-dev/runbox/internal/sparse"
)

// Remote is the file store the copies come from: s3store.Store. It keeps
// conversations' saved interpreter states too (snapshot.Blobs), which
// count in their quotas: a copy holds their room (State).
type Remote interface {
	List(ctx context.Context, conv string) ([]runbox.StoredFile, error)
	Open(ctx context.Context, conv, name string) (io.ReadSeekCloser, runbox.StoredFile, error)
	Put(ctx context.Context, conv, name string, r io.Reader, size int64) (runbox.StoredFile, error)
	Delete(ctx context.Context, conv string, names []string) error

	PutState(ctx context.Context, conv string, r io.Reader, limit int64) (int64, error)
	OpenState(ctx context.Context, conv string) (io.ReadCloser, error)
	RemoveState(ctx context.Context, conv string) error
	StateRoom(ctx context.Context, conv string) (int64, error)
	// StateSize returns the bytes of the conversation's saved state, 0
	// for none.
	StateSize(ctx context.Context, conv string) (int64, error)
}

// Versions are the versions of conversations' files in the shared state
// (store.Conversations): each change takes a new one, so that a copy knows when
// it is behind.
type Versions interface {
	FilesVersion(ctx context.Context, cid string) (int64, error)
	FilesChanged(ctx context.Context, cid string, seen int64, now time.Time) (version int64, current bool, err error)
	FilesUsed(ctx context.Context, cid string, now time.Time) error
	FilesRemoved(ctx context.Context, cid string) error
}

// Copies are an executor's working copies.
type Copies struct {
	remote   Remote
	folders  *files.Folders
	versions Versions
	uid, gid int
	log      *slog.Logger

	mu    sync.Mutex
	known map[string]*manifest // by conversation
}

// manifest is what this executor knows of a copy: the version it was
// current at (-1: none) and, per file, the store's ETag and the local size
// and time it had when fetched or pushed.
type manifest struct {
	version int64
	files   map[string]synced
}

type synced struct {
	etag    string
	size    int64
	modTime time.Time
}

// New returns working copies in folders of the files in remote; files are
// owned by uid and gid, the sandbox user.
func New(remote Remote, folders *files.Folders, versions Versions, uid, gid int, log *slog.Logger) *Copies {
	return &Copies{remote: remote, folders: folders, versions: versions, uid: uid, gid: gid,
		log: log.With("component", "workcopy"), known: map[string]*manifest{}}
}

// Forget drops what is known of a conversation's copy: its folder was
// removed, or is about to be.
func (c *Copies) Forget(cid string) {
	c.mu.Lock()
	delete(c.known, cid)
	c.mu.Unlock()
}

// manifest returns the conversation's manifest. The executor pulls and
// pushes one conversation's copy one run at a time (its runs' programs
// may overlap, their pulls and pushes do not), so a manifest has one user
// at a time.
func (c *Copies) manifest(cid string) *manifest {
	c.mu.Lock()
	defer c.mu.Unlock()
	m := c.known[cid]
	if m == nil {
		m = &manifest{version: -1, files: map[string]synced{}}
		c.known[cid] = m
	}
	return m
}

// Pull brings the copy of conversation cid, whose folder is ready
// (files.Folders.Ensure), up to the store's version. busy says that other
// runs of the conversation are running here: their programs may be
// writing the copy, so a file changed or made since the copy was last in
// step with the store is theirs and is kept, not replaced or removed
// (their pushes send it at their end); the copy then stays unsettled, and
// the next run lists the store again. A store whose files and state take
// more than the quota is refused (EQuotaExceeded) before anything is
// fetched; blocks of zeros are fetched as holes.
func (c *Copies) Pull(ctx context.Context, cid string, busy bool) error {
	m := c.manifest(cid)
	// The version is read before the listing: a change after it makes the
	// next run list again.
	v, err := c.versions.FilesVersion(ctx, cid)
	if err != nil {
		return err
	}
	if m.version == v {
		return nil
	}
	remote, err := c.remote.List(ctx, cid)
	if err != nil {
		return err
	}
	state, err := c.remote.StateSize(ctx, cid)
	if err != nil {
		return err
	}
	if err := c.remoteFits(remote, state); err != nil {
		return err
	}
	local, err := c.folders.List(cid)
	if err != nil {
		return err
	}
	root, err := os.OpenRoot(c.folders.Path(cid))
	if err != nil {
		return fmt.Errorf("open working copy: %w", err)
	}
	defer root.Close()
	fetched, kept, err := c.reconcile(ctx, root, cid, m, local, remote, busy)
	if err != nil {
		return err
	}
	// The room of the conversation's saved state in the store, which
	// its files leave it (its changes take versions too: State).
	if err := c.folders.HoldState(cid, state); err != nil {
		return err
	}
	if kept == 0 {
		m.version = v
	}
	c.log.Debug("working copy pulled", "conversation", cid, "version", v, "fetched", fetched, "kept", kept)
	return nil
}

// reconcile makes the copy's files (local, in root) the store's (remote),
// as Pull says: it fetches those the store changed and removes those it
// does not have, and when busy keeps those the copy changed. It returns
// how many it fetched and kept, and notes what it fetched and removed in
// m.
func (c *Copies) reconcile(ctx context.Context, root *os.Root, cid string, m *manifest, local, remote []runbox.StoredFile,
	busy bool) (fetched, kept int, err error) {
	here := make(map[string]runbox.StoredFile, len(local))
	for _, l := range local {
		here[l.Name] = l
	}
	// inStep reports whether the copy's file is as it was when last in
	// step with the store.
	inStep := func(l runbox.StoredFile) bool {
		s, known := m.files[l.Name]
		return known && s.size == l.Size && s.modTime.Equal(l.ModTime)
	}
	for _, r := range remote {
		l, ok := here[r.Name]
		delete(here, r.Name)
		if ok && inStep(l) && m.files[r.Name].etag == r.ETag {
			continue
		}
		if busy && ok && !inStep(l) {
			kept++
			continue
		}
		s, err := c.fetch(ctx, root, cid, r.Name)
		if err != nil {
			return fetched, kept, err
		}
		m.files[r.Name] = s
		fetched++
	}
	// What is left here the store does not have: removed elsewhere, or
	// written by a run whose push this executor did not finish.
	if len(local) < runbox.MaxListEntries && len(remote) < runbox.MaxListEntries {
		for name, l := range here {
			if busy && !inStep(l) {
				kept++
				continue
			}
			if err := root.Remove(name); err != nil && !errors.Is(err, fs.ErrNotExist) {
				return fetched, kept, fmt.Errorf("remove a file the store does not have: %w", err)
			}
			delete(m.files, name)
		}
	}
	return fetched, kept, nil
}

// remoteFits checks, before anything is fetched, that the store's files
// and state fit the copy's quota: the store counts them whole, and so
// does a copy in walk mode (fetch writes blocks of zeros as holes, but a
// program may fill them).
func (c *Copies) remoteFits(remote []runbox.StoredFile, state int64) error {
	size := state
	for _, r := range remote {
		size += r.Size
	}
	if q := c.folders.Quota(); size > q {
		return runbox.Errorf(runbox.EQuotaExceeded,
			"the conversation's files in the file store take %d bytes, more than its quota of %d", size, q)
	}
	return nil
}

// fits checks that the copy, as the store counts it (every file whole,
// its holes as data), fits its quota: files past it are not sent. Walk
// mode stops a run that goes past the quota, but one truncate takes less
// than a measurement; an image counts only blocks.
func (c *Copies) fits(cid string) error {
	size, err := c.folders.StoredSize(cid)
	if err != nil {
		return err
	}
	if q := c.folders.Quota(); size > q {
		return runbox.Errorf(runbox.EQuotaExceeded,
			"the conversation's files take %d bytes as the file store counts them (a sparse file for its whole size), more than its quota of %d; they were not saved",
			size, q)
	}
	return nil
}

// fetch writes the store's file name into the copy, whole or not at all.
func (c *Copies) fetch(ctx context.Context, root *os.Root, cid, name string) (synced, error) {
	r, info, err := c.remote.Open(ctx, cid, name)
	if err != nil {
		return synced{}, err
	}
	defer r.Close()
	if dir := path.Dir(name); dir != "." {
		if err := root.MkdirAll(dir, 0o755); err != nil {
			return synced{}, fmt.Errorf("fetch %s: %w", name, err)
		}
		for d := dir; d != "."; d = path.Dir(d) {
			_ = root.Lchown(d, c.uid, c.gid)
		}
	}
	// Beside the file, so that the rename stays in one folder; listings
	// skip the prefix.
	tmp := path.Join(path.Dir(name), files.UploadPrefix+strings.ToLower(rand.Text()[:12]))
	out, err := root.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return synced{}, fmt.Errorf("fetch %s: %w", name, err)
	}
	defer root.Remove(tmp)
	// S3 has no holes: blocks of zeros become holes again.
	_, err = sparse.Write(out, r)
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return synced{}, fmt.Errorf("fetch %s: %w", name, err)
	}
	_ = root.Lchown(tmp, c.uid, c.gid) // so that programs may change it
	// A run may have left a folder where the file goes: the store wins.
	if fi, err := root.Lstat(name); err == nil && fi.IsDir() {
		if err := root.RemoveAll(name); err != nil {
			return synced{}, fmt.Errorf("fetch %s: %w", name, err)
		}
	}
	if err := root.Rename(tmp, name); err != nil {
		return synced{}, fmt.Errorf("fetch %s: %w", name, err)
	}
	fi, err := root.Lstat(name)
	if err != nil {
		return synced{}, fmt.Errorf("fetch %s: %w", name, err)
	}
	return synced{etag: info.ETag, size: fi.Size(), modTime: fi.ModTime()}, nil
}

// Push sends what a run changed, from the listings of the copy before
// and after it, to the store, and records the change. A copy that takes
// more than the quota as the store counts it (fits) sends nothing
// (EQuotaExceeded): the next run lists the store again, and the copy
// loses what the store did not take.
func (c *Copies) Push(ctx context.Context, cid string, before, after []runbox.StoredFile) error {
	m := c.manifest(cid)
	changed := files.Changed(before, after)
	var removed []string
	// A listing cut at its bound does not say what was removed.
	if len(before) < runbox.MaxListEntries && len(after) < runbox.MaxListEntries {
		now := make(map[string]bool, len(after))
		for _, a := range after {
			now[a.Name] = true
		}
		for _, b := range before {
			if !now[b.Name] {
				removed = append(removed, b.Name)
			}
		}
	}
	if len(changed) == 0 && len(removed) == 0 {
		return c.versions.FilesUsed(ctx, cid, time.Now())
	}
	// Until the push is recorded the copy is ahead of the store: if it
	// fails, the next run lists the store again (and the copy loses what
	// the store did not get, as the failed run's result said).
	seen := m.version
	m.version = -1
	if len(changed) > 0 { // a push that only removes never grows the store
		if err := c.fits(cid); err != nil {
			return err
		}
	}
	root, err := os.OpenRoot(c.folders.Path(cid))
	if err != nil {
		return fmt.Errorf("open working copy: %w", err)
	}
	defer root.Close()
	for _, e := range changed {
		if !utf8.ValidString(e.Name) {
			// S3 keys are UTF-8: such a file stays on this executor only.
			c.log.Warn("a file whose name is not UTF-8 is not kept in the store", "conversation", cid)
			continue
		}
		s, err := c.put(ctx, root, cid, e)
		if err != nil {
			return err
		}
		m.files[e.Name] = s
	}
	if err := c.remote.Delete(ctx, cid, removed); err != nil {
		return err
	}
	for _, n := range removed {
		delete(m.files, n)
	}
	v, current, err := c.versions.FilesChanged(ctx, cid, seen, time.Now())
	if err != nil {
		return err
	}
	if current { // else another change came between: the next run lists the store
		m.version = v
	}
	return nil
}

// put sends one file of the copy to the store. It opens nothing but a
// regular file and follows no link.
func (c *Copies) put(ctx context.Context, root *os.Root, cid string, e runbox.StoredFile) (synced, error) {
	f, err := root.OpenFile(e.Name, os.O_RDONLY|syscall.O_NONBLOCK|syscall.O_NOFOLLOW, 0)
	if err != nil {
		return synced{}, fmt.Errorf("push %s: %w", e.Name, err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil || !fi.Mode().IsRegular() {
		return synced{}, fmt.Errorf("push %s: not a regular file", e.Name)
	}
	st, err := c.remote.Put(ctx, cid, e.Name, io.LimitReader(f, fi.Size()), fi.Size())
	if err != nil {
		return synced{}, err
	}
	return synced{etag: st.ETag, size: fi.Size(), modTime: fi.ModTime()}, nil
}

// The copies are where an executor's kept interpreters' saved states go
// (snapshot.Blobs): to the remote store, while a conversation's copy here
// holds the room of its state (files.Folders.HoldState), which its
// sandbox may not write. Each change of a state takes a new version of the
// conversation's files, so that a copy on another executor learns it at
// its next run (Pull); this one's lists the store again then, as after
// another's change: the manifest is left to the runs' pulls and pushes.

// PutState stores the conversation's saved state in the remote store.
func (c *Copies) PutState(ctx context.Context, cid string, r io.Reader, limit int64) (int64, error) {
	n, err := c.remote.PutState(ctx, cid, r, limit)
	if err != nil {
		return 0, err
	}
	if err := c.stateChanged(ctx, cid, n); err != nil {
		return 0, errors.Join(err, c.remote.RemoveState(context.WithoutCancel(ctx), cid))
	}
	return n, nil
}

// OpenState opens the conversation's saved state in the remote store.
func (c *Copies) OpenState(ctx context.Context, cid string) (io.ReadCloser, error) {
	return c.remote.OpenState(ctx, cid)
}

// RemoveState removes the conversation's saved state from the remote
// store, and gives its room back to the copy.
func (c *Copies) RemoveState(ctx context.Context, cid string) error {
	if err := c.remote.RemoveState(ctx, cid); err != nil {
		return err
	}
	return c.stateChanged(ctx, cid, 0)
}

// StateRoom returns how many bytes the conversation's saved state may
// take.
func (c *Copies) StateRoom(ctx context.Context, cid string) (int64, error) {
	return c.remote.StateRoom(ctx, cid)
}

// stateChanged holds the room of the conversation's state, now size bytes,
// in its copy here, if it has one, and takes a new version of its files.
func (c *Copies) stateChanged(ctx context.Context, cid string, size int64) error {
	if c.folders.Exists(cid) {
		if err := c.folders.HoldState(cid, size); err != nil {
			return err
		}
	}
	_, _, err := c.versions.FilesChanged(ctx, cid, -1, time.Now())
	return err
}
