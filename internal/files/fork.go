package files

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/runbox-dev/runbox"
	"github.com/runbox-dev/runbox/internal/sparse"
)

// forksDir holds the forks being made; its name is no valid conversation
// id.
const forksDir = ".forks"

// Fork copies conversation src's folder (installed packages included: they
// live in it) to a new conversation dst. The copy is made aside, under
// forksDir, in a folder bounded like any other (its own disk image in loop
// mode), and renamed into place at the end without replacing anything: a
// dst that has a folder by then is runbox.ErrForkExists, and a fork that fails
// leaves nothing.
//
// Before anything is made, the source is measured as the fork's quota
// counts it (space.copySize: apparent sizes in walk mode, blocks in an
// image), its saved state included: a source that would not fit is
// refused with EQuotaExceeded, not copied until the quota stops it.
//
// Each file is a reflink of the source's where the file system can
// (FICLONE: btrfs, XFS; a write to either copy then makes its own blocks,
// so neither sees the other's writes), else its data is copied, its holes
// left holes (sparse.Copy); never a hard link, which would share writes.
// Across loop-mounted images, one per conversation, it is always a copy.
//
// The source's lock is held throughout, so that no upload, slot hand-over
// or recycling changes it meanwhile; runs do not take it: the caller sees
// to it that none writes (conversations.Service.Fork).
func (f *Folders) Fork(ctx context.Context, src, dst string) (runbox.Forked, error) {
	if !runbox.ValidConversationKey(src) || !runbox.ValidConversationKey(dst) || src == dst {
		return runbox.Forked{}, runbox.Errorf(runbox.EInvalid, "invalid conversationId")
	}
	if f.Exists(dst) {
		return runbox.Forked{}, runbox.ErrForkExists
	}
	f.removeStaleForks()
	from, done, err := f.forkSource(src)
	if err != nil {
		return runbox.Forked{}, err
	}
	defer done()
	stage := filepath.Join(f.root, forksDir, dst+"-"+strings.ToLower(rand.Text()[:12]))
	if err := os.MkdirAll(stage, 0o711); err != nil {
		return runbox.Forked{}, fmt.Errorf("create fork folder: %w", err)
	}
	stageFiles := filepath.Join(stage, "files")
	if err := f.space.prepare(stage, stageFiles); err != nil {
		os.RemoveAll(stage)
		return runbox.Forked{}, err
	}
	var forked runbox.Forked
	if from != nil {
		forked, err = f.copyFolder(ctx, from, stageFiles)
	}
	if err == nil {
		err = f.place(stage, dst)
	}
	if err != nil {
		if rerr := f.space.release(stageFiles); rerr == nil {
			os.RemoveAll(stage)
		}
		return runbox.Forked{}, err
	}
	forked.Packages = true
	return forked, nil
}

// forkSource holds conversation src's lock and opens its files, once they
// are known to fit a fork's quota; done closes them and lets the lock go.
// A conversation with no folder has no files (nil): its fork starts empty.
func (f *Folders) forkSource(src string) (_ *os.Root, done func(), _ error) {
	if !f.Exists(src) {
		return nil, func() {}, nil
	}
	unlock, err := f.lock(src)
	if err != nil {
		return nil, nil, err
	}
	from, err := f.ensureLocked(src) // in loop mode, mounts a released image
	if err == nil {
		err = f.fits(src, from)
	}
	var root *os.Root
	if err == nil {
		if root, err = os.OpenRoot(from); err != nil {
			err = fmt.Errorf("open conversation folder: %w", err)
		}
	}
	if err != nil {
		unlock()
		return nil, nil, err
	}
	return root, func() { root.Close(); unlock() }, nil
}

// fits checks that a copy of conversation src's folder from, and its
// saved state, fits a folder's quota.
func (f *Folders) fits(src, from string) error {
	m, err := measure(from, walkTime)
	if err != nil {
		return err
	}
	size, ok := f.space.copySize(m)
	if size += f.stateSize(src); !ok || size > f.quota {
		return runbox.Errorf(runbox.EQuotaExceeded,
			"the conversation's files take %d bytes (%d entries; a sparse file counts for its whole size), more than a conversation's quota of %d bytes",
			size, m.entries, f.quota)
	}
	return nil
}

// staleFork is the age past which a fork's staging folder was left by a
// process that stopped mid-fork: no fork takes that long.
const staleFork = time.Hour

// removeStaleForks removes the staging folders of forks that never
// finished (their process stopped), unmounting their images first.
func (f *Folders) removeStaleForks() {
	entries, err := os.ReadDir(filepath.Join(f.root, forksDir))
	if err != nil {
		return
	}
	for _, e := range entries {
		info, err := e.Info()
		if err != nil || time.Since(info.ModTime()) < staleFork {
			continue
		}
		stage := filepath.Join(f.root, forksDir, e.Name())
		if err := f.space.release(filepath.Join(stage, "files")); err == nil {
			os.RemoveAll(stage)
		}
	}
}

// copyFolder copies the files of the folder from into the folder to,
// within the quota.
func (f *Folders) copyFolder(ctx context.Context, from *os.Root, to string) (runbox.Forked, error) {
	toRoot, err := os.OpenRoot(to)
	if err != nil {
		return runbox.Forked{}, fmt.Errorf("open fork folder: %w", err)
	}
	defer toRoot.Close()
	c := treeCopy{ctx: ctx, from: from, to: toRoot, uid: f.uid, gid: f.gid, quota: f.quota, left: f.quota}
	if err := fs.WalkDir(from.FS(), ".", c.entry); err != nil {
		return runbox.Forked{}, err
	}
	return c.done, nil
}

// place renames the fork's folder to conversation dst's, replacing
// nothing.
func (f *Folders) place(stage, dst string) error {
	err := unix.Renameat2(unix.AT_FDCWD, stage, unix.AT_FDCWD, f.convDir(dst), unix.RENAME_NOREPLACE)
	if errors.Is(err, unix.EEXIST) || errors.Is(err, unix.ENOTEMPTY) {
		return runbox.ErrForkExists
	}
	if err != nil {
		return fmt.Errorf("place fork: %w", err)
	}
	return nil
}

// treeCopy copies a folder tree from one root to another: folders, regular
// files and symbolic links (as they are: every later access goes through
// os.Root, so a link leads nowhere outside); anything else (FIFOs,
// sockets, devices) is left out. Hard links within the tree become
// separate files. Modes and modification times are kept; what it makes
// belongs to uid:gid, the sandbox user. It writes at most left bytes of
// data: Fork measured the source, and this holds if it grew since (a
// process a run left running writes to it).
type treeCopy struct {
	ctx      context.Context
	from, to *os.Root
	uid, gid int
	quota    int64
	left     int64
	done     runbox.Forked
}

func (c *treeCopy) entry(p string, d fs.DirEntry, err error) error {
	if err != nil {
		return fmt.Errorf("read %s: %w", p, err)
	}
	if err := c.ctx.Err(); err != nil {
		return err
	}
	info, err := d.Info()
	if err != nil {
		return fmt.Errorf("read %s: %w", p, err)
	}
	switch {
	case p == ".":
		return nil
	case d.IsDir():
		if err := c.to.Mkdir(p, info.Mode().Perm()); err != nil {
			return fmt.Errorf("copy folder %s: %w", p, err)
		}
	case d.Type()&fs.ModeSymlink != 0:
		target, err := c.from.Readlink(p)
		if err == nil {
			err = c.to.Symlink(target, p)
		}
		if err != nil {
			return fmt.Errorf("copy link %s: %w", p, err)
		}
		_ = c.to.Lchown(p, c.uid, c.gid)
		return nil
	case d.Type().IsRegular():
		if err := c.file(p, info); err != nil {
			return err
		}
	default:
		return nil
	}
	_ = c.to.Lchown(p, c.uid, c.gid) // so that programs may change it
	// A folder's time changes as its entries are made: WalkDir gives no
	// hook after them, so only files keep theirs.
	if !d.IsDir() {
		_ = c.to.Chtimes(p, info.ModTime(), info.ModTime())
	}
	return nil
}

// file copies one regular file: a reflink where the file system can, its
// data otherwise. It opens nothing but a regular file and follows no
// link.
func (c *treeCopy) file(p string, info fs.FileInfo) error {
	in, err := c.from.OpenFile(p, os.O_RDONLY|syscall.O_NONBLOCK|syscall.O_NOFOLLOW, 0)
	if err != nil {
		return fmt.Errorf("copy %s: %w", p, err)
	}
	defer in.Close()
	st, err := in.Stat()
	if err != nil || !st.Mode().IsRegular() {
		return fmt.Errorf("copy %s: not a regular file", p)
	}
	out, err := c.to.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_EXCL, info.Mode().Perm())
	if err != nil {
		return fmt.Errorf("copy %s: %w", p, err)
	}
	cloned, written, err := cloneFile(out, in, st.Size(), c.left)
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	c.left -= written
	if errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT) || errors.Is(err, sparse.ErrBudget) {
		return runbox.FileQuotaError(c.quota)
	}
	if err != nil {
		return fmt.Errorf("copy %s: %w", p, err)
	}
	c.done.Files++
	c.done.Bytes += st.Size()
	if cloned {
		c.done.Cloned++
	}
	return nil
}

// cloneFile makes out, an empty file, a copy of in's size bytes: a reflink
// (FICLONE) where the file system shares blocks copy-on-write, else a copy
// of its data, at most budget bytes, holes kept (sparse.Copy). It reports
// which, and the bytes it wrote.
func cloneFile(out, in *os.File, size, budget int64) (cloned bool, written int64, err error) {
	err = unix.IoctlFileClone(int(out.Fd()), int(in.Fd()))
	if err == nil {
		return true, 0, nil
	}
	if !cloneUnsupported(err) {
		return false, 0, err
	}
	written, err = sparse.Copy(out, in, size, budget)
	return false, written, err
}

// cloneUnsupported reports an error of FICLONE that says the file system,
// or this pair of files, cannot share blocks: ext4 and tmpfs, files on two
// file systems (loop-mounted images).
func cloneUnsupported(err error) bool {
	for _, e := range []error{unix.EOPNOTSUPP, unix.ENOTSUP, unix.EXDEV, unix.EINVAL, unix.ENOTTY, unix.ENOSYS} {
		if errors.Is(err, e) {
			return true
		}
	}
	return false
}
