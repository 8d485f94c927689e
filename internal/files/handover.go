package files

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/runbox-dev/runbox/internal/sparse"
)

// In loop mode a conversation's folder is its own disk image, which a
// sandbox's bind mount holds for as long as the sandbox lives: handing a
// sandbox to another conversation cannot move the image. The files move
// instead, copied from one image to the other, and then the two
// conversation folders (each an image and its mount point) exchange names.
// A conversation whose files take more than MaxHandover is not handed
// over: its sandbox is removed, as without recycling.
//
// A conversation with no files needs no image while no sandbox holds it:
// it is left an empty folder, and its next use makes its image, as for a
// new conversation (prepare). A hand-over then costs two renames, where
// making an image costs an mkfs and a mount (and an unmount later).

// MaxHandover bounds the bytes copied to hand a loop-mode sandbox over;
// maxHandoverEntries bounds the entries (each costs a few system calls).
const (
	MaxHandover        = 64 << 20
	maxHandoverEntries = 10000
)

// ErrSlotDirty reports a slot that could not be emptied after a failed
// hand-over: its sandbox must be removed, never used again.
var ErrSlotDirty = errors.New("the slot could not be emptied")

// copyTree copies the entries of the folder src into the empty folder dst,
// owned by uid:gid, never following a link: folders, regular files
// (data, holes kept; permissions without set-id bits, times) and symbolic
// links (as links); FIFOs, sockets and devices are left out. It fails
// before writing past limit bytes of data, or past maxHandoverEntries
// entries.
func copyTree(src, dst string, limit int64, uid, gid int) error {
	from, err := os.OpenRoot(src)
	if err != nil {
		return err
	}
	defer from.Close()
	to, err := os.OpenRoot(dst)
	if err != nil {
		return err
	}
	defer to.Close()
	budget, entries := limit, 0
	return fs.WalkDir(from.FS(), ".", func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if p == "." {
			return nil
		}
		if entries++; entries > maxHandoverEntries {
			return fmt.Errorf("more than %d entries to copy", maxHandoverEntries)
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		perm := info.Mode().Perm() | info.Mode()&fs.ModeSticky
		switch {
		case d.IsDir():
			if err := to.Mkdir(p, 0o700); err != nil {
				return err
			}
			if err := to.Chmod(p, perm); err != nil {
				return err
			}
		case d.Type()&fs.ModeSymlink != 0:
			target, err := from.Readlink(p)
			if err != nil {
				return err
			}
			if err := to.Symlink(target, p); err != nil {
				return err
			}
		case d.Type().IsRegular():
			n, err := copyFile(from, to, p, perm, budget)
			if err != nil {
				return err
			}
			budget -= n
			if err := to.Chtimes(p, info.ModTime(), info.ModTime()); err != nil {
				return err
			}
		default:
			return nil
		}
		return to.Lchown(p, uid, gid)
	})
}

// copyFile copies one regular file, its data only (its holes stay holes:
// the image counts the blocks written), and returns the bytes it wrote;
// it writes none past budget.
func copyFile(from, to *os.Root, p string, perm fs.FileMode, budget int64) (int64, error) {
	in, err := from.OpenFile(p, os.O_RDONLY|syscall.O_NOFOLLOW|syscall.O_NONBLOCK, 0)
	if err != nil {
		return 0, err
	}
	defer in.Close()
	st, err := in.Stat()
	if err != nil || !st.Mode().IsRegular() {
		return 0, fmt.Errorf("%s is not a regular file", p)
	}
	out, err := to.OpenFile(p, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return 0, err
	}
	n, err := sparse.Copy(out, in, st.Size(), budget)
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	if errors.Is(err, sparse.ErrBudget) {
		err = fmt.Errorf("more than %d bytes to copy", MaxHandover)
	}
	if err != nil {
		return n, err
	}
	return n, to.Chmod(p, perm)
}

// emptyFolder removes every entry of dir and checks that none is left.
func emptyFolder(dir string) error {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return err
	}
	for _, e := range entries {
		if err := os.RemoveAll(filepath.Join(dir, e.Name())); err != nil {
			return err
		}
	}
	if left, err := os.ReadDir(dir); err != nil || len(left) > 0 {
		return fmt.Errorf("%d entries left (%v)", len(left), err)
	}
	return nil
}

// exchange swaps the names of conversation cid's folder and other (a
// slot), its lock held: the lock file is linked into other first, so that
// the conversation's path keeps the lock this process holds.
func (f *Folders) exchange(cid, other string) error {
	lock, link := filepath.Join(f.convDir(cid), ".lock"), filepath.Join(other, ".lock")
	if err := os.Link(lock, link); err != nil {
		return fmt.Errorf("keep the conversation's lock: %w", err)
	}
	if err := unix.Renameat2(unix.AT_FDCWD, f.convDir(cid), unix.AT_FDCWD, other, unix.RENAME_EXCHANGE); err != nil {
		os.Remove(link)
		return err
	}
	// other now names the conversation's old folder, and its lock's old
	// name.
	return os.Remove(link)
}

// recycleImage is Recycle in loop mode, under the conversation's lock: the
// conversation's files are copied into a new image, which takes the
// conversation's name; the sandbox's image, emptied, becomes the slot.
func (f *Folders) recycleImage(cid, name string) (string, error) {
	conv := f.Path(cid)
	if used, _, err := f.space.usage(conv); err != nil || used > MaxHandover {
		return "", fmt.Errorf("recycle %s: %w (%d bytes, %v)", cid, ErrNotRecyclable, used, err)
	}
	empty, err := isEmpty(conv)
	if err != nil {
		return "", fmt.Errorf("recycle %s: %w", cid, err)
	}
	var slotFiles string
	if empty {
		slotFiles, err = f.newEmptySlot(name)
	} else {
		slotFiles, err = f.NewSlot(name)
	}
	if err != nil {
		return "", err
	}
	slot := filepath.Dir(slotFiles)
	if !empty {
		if err := copyTree(conv, slotFiles, MaxHandover, f.uid, f.gid); err != nil {
			_ = f.RemoveSlot(slotFiles)
			return "", fmt.Errorf("recycle %s: copy its files: %w", cid, err)
		}
	}
	if err := f.exchange(cid, slot); err != nil {
		_ = f.RemoveSlot(slotFiles)
		return "", fmt.Errorf("recycle %s: %w", cid, err)
	}
	// slotFiles is now the sandbox's image: the conversation's files
	// there are copies.
	if err := emptyFolder(slotFiles); err != nil {
		return "", fmt.Errorf("recycle %s: %w: %w", cid, ErrSlotDirty, err)
	}
	return slotFiles, nil
}

// moveIntoImage is MoveInto in loop mode, under the conversation's lock:
// the conversation's files are copied into the slot's image, the slot
// takes the conversation's name, and the conversation's old image goes.
func (f *Folders) moveIntoImage(slotFiles, cid string) (string, error) {
	conv := f.Path(cid)
	imageless := false
	if _, err := os.Lstat(filepath.Join(f.convDir(cid), "files.img")); errors.Is(err, fs.ErrNotExist) {
		// An empty conversation's folder (see above): nothing to copy.
		if imageless, err = isEmpty(conv); err != nil {
			return "", fmt.Errorf("move %s into a sandbox: %w", cid, err)
		}
	}
	if !imageless {
		var err error
		if conv, err = f.ensureLocked(cid); err != nil { // mounted again if the janitor released it
			return "", err
		}
		if used, _, err := f.space.usage(conv); err != nil || used > MaxHandover {
			return "", fmt.Errorf("move %s into a sandbox: %w (%d bytes, %v)", cid, ErrNotRecyclable, used, err)
		}
	}
	if err := copyTree(conv, slotFiles, MaxHandover, f.uid, f.gid); err != nil {
		if eerr := emptyFolder(slotFiles); eerr != nil {
			return "", fmt.Errorf("move %s into a sandbox: %w: %w", cid, ErrSlotDirty, eerr)
		}
		return "", fmt.Errorf("move %s into a sandbox: copy its files: %w", cid, err)
	}
	slot := filepath.Dir(slotFiles)
	if err := f.exchange(cid, slot); err != nil {
		if eerr := emptyFolder(slotFiles); eerr != nil {
			return "", fmt.Errorf("move %s into a sandbox: %w: %w", cid, ErrSlotDirty, eerr)
		}
		return "", fmt.Errorf("move %s into a sandbox: %w", cid, err)
	}
	// slot now names the conversation's old image, which nothing mounts.
	if err := f.RemoveSlot(filepath.Join(slot, "files")); err != nil {
		return "", fmt.Errorf("move %s into a sandbox: remove its old image: %w", cid, err)
	}
	now := time.Now()
	_ = os.Chtimes(f.convDir(cid), now, now) // last use, for retention
	return f.Path(cid), nil
}

// newEmptySlot makes a slot with no disk image, for an empty conversation
// (see above), and returns the host path of its files folder.
func (f *Folders) newEmptySlot(name string) (string, error) {
	if err := validSlotName(name); err != nil {
		return "", err
	}
	files := filepath.Join(f.slotDir(name), "files")
	if err := os.MkdirAll(files, 0o755); err != nil {
		return "", fmt.Errorf("create slot: %w", err)
	}
	if err := os.Chmod(filepath.Dir(files), 0o711); err != nil {
		return "", fmt.Errorf("create slot: %w", err)
	}
	return files, nil
}

// isEmpty reports whether a folder has no entries.
func isEmpty(dir string) (bool, error) {
	d, err := os.Open(dir)
	if err != nil {
		return false, err
	}
	defer d.Close()
	names, err := d.Readdirnames(1)
	if errors.Is(err, io.EOF) {
		return true, nil
	}
	return len(names) == 0 && err == nil, err
}
