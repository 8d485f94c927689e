package files

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/moby/sys/mountinfo"
	"golang.org/x/sys/unix"

	"github.com/runbox-dev/runbox"
)

// A conversation's files never exceed its quota. Two ways of holding them
// to it:
//
//   - loopSpace gives each conversation a filesystem of its own: an ext4
//     image the size of the quota, loop-mounted on its files folder. The
//     kernel enforces the limit on every write, fallocate included, so a
//     sandbox cannot fill the host's disk whatever it does. It needs root
//     and a host that can loop-mount; SANDBOX_ROOT must not be shared by
//     several hosts (each would mount the images).
//   - walkSpace is a plain folder whose usage is measured by walking it.
//     The executor stops a run that goes past the quota, but a program can
//     overshoot for as long as a check takes. It is the fallback.

// space bounds conversation folders.
type space interface {
	// prepare makes a conversation's files folder exist, bounded. It is
	// called with the conversation locked.
	prepare(convDir, filesDir string) error
	// usage returns the bytes a conversation's files use, and how many
	// more they may.
	usage(filesDir string) (used, free int64, err error)
	// release undoes prepare's mount, if any; the files stay.
	release(filesDir string) error
	// reserve holds bytes of a prepared folder's room for what the
	// conversation keeps beside it (its saved interpreter state), out of
	// every writer's reach, where the kernel enforces the quota.
	reserve(filesDir string, bytes int64) error
	// copySize returns what a copy of a folder measured as m, its holes
	// kept, takes of a folder of this space as its quota counts it; ok is
	// false where its entries are more than such a folder may hold.
	copySize(m measured) (size int64, ok bool)
	// hard reports whether the kernel enforces the quota.
	hard() bool
}

// QuotaMode chooses how quotas are held.
type QuotaMode string

const (
	QuotaAuto QuotaMode = "auto" // loop when the host allows it, else walk
	QuotaLoop QuotaMode = "loop"
	QuotaWalk QuotaMode = "walk"
)

// newSpace picks the space for mode, probing the host in auto mode; where
// auto mode falls back to walking, why loop-mounted images would not do.
func newSpace(mode QuotaMode, root string, quota int64, files, uid, gid int) (_ space, fallback, _ error) {
	walk := walkSpace{quota: quota, files: files, uid: uid, gid: gid, timeout: walkTime}
	loop := loopSpace{quota: quota, uid: uid, gid: gid, walk: walk}
	switch mode {
	case QuotaWalk:
		return walk, nil, nil
	case QuotaLoop:
		if err := loop.probe(root); err != nil {
			return nil, nil, fmt.Errorf("loop-mounted quotas are not available here: %w", err)
		}
		return loop, nil, nil
	default:
		if err := loop.probe(root); err != nil {
			return walk, err, nil
		}
		return loop, nil, nil
	}
}

type walkSpace struct {
	quota    int64
	files    int // most entries (files, folders, links) a conversation may hold
	uid, gid int
	timeout  time.Duration // bounds one measurement
}

// walkTime bounds one measurement of a folder. A folder that cannot be
// measured in that time is unmeasurable (ErrUnmeasurable): a program must
// not make its own quota check too slow to finish.
const walkTime = 10 * time.Second

// ErrUnmeasurable: a folder in walk mode holds more than a measurement can
// walk in walkTime. It counts as full, and a run in it is stopped: what it
// adds could not be told from nothing.
var ErrUnmeasurable = runbox.Errorf(runbox.EQuotaExceeded, "the conversation's folder holds too many files to measure; delete some")

// minEntryBytes is what an entry counts for at least, whatever its size:
// an empty file takes no block but an inode, and a million of them must
// not be free.
const minEntryBytes = 4096

func (w walkSpace) hard() bool { return false }

func (w walkSpace) prepare(_, filesDir string) error {
	switch err := os.Mkdir(filesDir, 0o755); {
	case err == nil:
		if err := os.Lchown(filesDir, w.uid, w.gid); err != nil {
			// Not root: let the sandbox user write anyway.
			if err := os.Chmod(filesDir, 0o777); err != nil {
				return fmt.Errorf("open conversation folder to the sandbox: %w", err)
			}
		}
	case errors.Is(err, fs.ErrExist):
	default:
		return fmt.Errorf("create conversation folder: %w", err)
	}
	return nil
}

// usage walks the folder, counting every entry however far past the
// quota: a conversation already past it (a run overshot, the quota was
// lowered) must still show what a run adds. Past w.files entries the
// folder has no room left; past w.timeout the walk gives up with
// ErrUnmeasurable.
func (w walkSpace) usage(filesDir string) (int64, int64, error) {
	m, err := measure(filesDir, w.timeout)
	if err != nil || w.overfull(m) {
		return m.bytes, 0, err
	}
	return m.bytes, max(w.quota-m.bytes, 0), nil
}

// overfull reports a folder of more entries than one may hold.
func (w walkSpace) overfull(m measured) bool { return w.files > 0 && m.entries > w.files }

// copySize: a copy counts as its source does.
func (w walkSpace) copySize(m measured) (int64, bool) { return m.bytes, !w.overfull(m) }

// measured is what a walk of a folder found.
type measured struct {
	bytes   int64 // what walk mode counts: entryBytes of every entry
	blocks  int64 // the bytes of the blocks they take
	entries int
}

// measure walks the folder filesDir (a missing one is empty), within
// timeout (ErrUnmeasurable past it, with what it counted so far).
func measure(filesDir string, timeout time.Duration) (measured, error) {
	var m measured
	root, err := os.OpenRoot(filesDir)
	if errors.Is(err, fs.ErrNotExist) {
		return m, nil
	}
	if err != nil {
		return m, err
	}
	defer root.Close()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	err = fs.WalkDir(root.FS(), ".", func(_ string, d fs.DirEntry, err error) error {
		if err != nil {
			return nil
		}
		if ctx.Err() != nil {
			return ErrUnmeasurable
		}
		m.entries++
		info, err := d.Info()
		if err != nil {
			return nil
		}
		m.bytes += entryBytes(info)
		m.blocks += allocated(info)
		return nil
	})
	return m, err
}

// entryBytes is what an entry counts for in walk mode: its apparent size
// or the blocks it takes, whichever is more, and at least minEntryBytes.
// Its apparent size even where it has holes, which take no block here:
// every copy that cannot keep them (to a file store, into a pod, in an
// archive) writes them out whole, and a program makes a file of a
// terabyte with one truncate. So no copy of a folder within its quota
// exceeds it, and a fork's check and this measure agree (Fork).
func entryBytes(info fs.FileInfo) int64 {
	return max(info.Size(), allocated(info), minEntryBytes)
}

// allocated returns the bytes of the blocks an entry takes (0 where the
// file system does not say): what a copy that keeps holes writes of it at
// most.
func allocated(info fs.FileInfo) int64 {
	if st, ok := info.Sys().(*syscall.Stat_t); ok {
		return max(st.Blocks*512, 0)
	}
	return 0
}

func (w walkSpace) release(string) error { return nil }

// reserve: Folders.Usage counts the state, and the executor's checks
// stop a run that goes past the quota with it.
func (w walkSpace) reserve(string, int64) error { return nil }

type loopSpace struct {
	quota    int64
	uid, gid int
	walk     walkSpace // for folders made before loop mode was on
}

func (l loopSpace) hard() bool { return true }

// copySize: the image counts the blocks written, and a copy that keeps
// holes writes no more than its source's; its inodes are the image's
// own bound.
func (l loopSpace) copySize(m measured) (int64, bool) { return m.blocks, true }

// probe checks that this process can make and mount an image, and hold
// room in it (reserve: /sys must be writable).
func (l loopSpace) probe(root string) error {
	if os.Geteuid() != 0 {
		return errors.New("not running as root")
	}
	for _, bin := range []string{"mount", "umount", "mkfs.ext4"} {
		if _, err := exec.LookPath(bin); err != nil {
			return fmt.Errorf("%s is not installed", bin)
		}
	}
	dir, err := os.MkdirTemp(root, ".probe-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	img, mnt := filepath.Join(dir, "img"), filepath.Join(dir, "mnt")
	if err := makeImage(img, 8<<20, l.uid, l.gid); err != nil {
		return err
	}
	if err := os.Mkdir(mnt, 0o755); err != nil {
		return err
	}
	if err := mountImage(img, mnt); err != nil {
		return err
	}
	err = l.reserve(mnt, 1<<20)
	return errors.Join(err, unmount(mnt))
}

func (l loopSpace) prepare(convDir, filesDir string) error {
	img := filepath.Join(convDir, "files.img")
	mounted, err := isMountPoint(filesDir)
	if err != nil || mounted {
		return err
	}
	if _, err := os.Stat(img); errors.Is(err, fs.ErrNotExist) {
		if entries, err := os.ReadDir(filesDir); err == nil && len(entries) > 0 {
			// A folder from before quotas were loop-mounted: keep it.
			return l.walk.prepare(convDir, filesDir)
		}
		if err := makeImage(img, l.quota, l.uid, l.gid); err != nil {
			return err
		}
	}
	if err := os.MkdirAll(filesDir, 0o755); err != nil {
		return fmt.Errorf("create conversation folder: %w", err)
	}
	if err := mountImage(img, filesDir); err != nil {
		return err
	}
	// mkfs leaves lost+found; /data should start empty.
	_ = os.Remove(filepath.Join(filesDir, "lost+found"))
	return nil
}

func (l loopSpace) usage(filesDir string) (int64, int64, error) {
	mounted, err := isMountPoint(filesDir)
	if err != nil {
		return 0, 0, err
	}
	if !mounted {
		return l.walk.usage(filesDir)
	}
	var st syscall.Statfs_t
	if err := syscall.Statfs(filesDir, &st); err != nil {
		return 0, 0, fmt.Errorf("statfs: %w", err)
	}
	bs := int64(st.Bsize)
	return int64(st.Blocks-st.Bfree) * bs, int64(st.Bavail) * bs, nil
}

// reserve sets the mounted image's reserved clusters (ext4's sysfs
// reserved_clusters) to the kernel's own reserve plus bytes. Unlike the
// superblock's reserved blocks (tune2fs -r), which root, and so the host
// side of a gVisor sandbox, may still use, and which e2fsprogs caps at
// half the image, these no writer gets, root and fallocate included, and
// statfs leaves them out of Bavail. They last as long as the mount: prepare's
// callers reserve again after each.
func (l loopSpace) reserve(filesDir string, bytes int64) error {
	mounted, err := isMountPoint(filesDir)
	if err != nil || !mounted {
		return err
	}
	var st unix.Stat_t
	if err := unix.Stat(filesDir, &st); err != nil {
		return fmt.Errorf("reserve room: %w", err)
	}
	// The loop device's name, as /sys/fs/ext4 knows it.
	link, err := os.Readlink(fmt.Sprintf("/sys/dev/block/%d:%d", unix.Major(st.Dev), unix.Minor(st.Dev)))
	if err != nil {
		return fmt.Errorf("reserve room: %w", err)
	}
	dev := filepath.Base(link)
	sectors, err := os.ReadFile(filepath.Join("/sys/block", dev, "size"))
	if err != nil {
		return fmt.Errorf("reserve room: %w", err)
	}
	size, err := strconv.ParseInt(strings.TrimSpace(string(sectors)), 10, 64)
	if err != nil {
		return fmt.Errorf("reserve room: size of %s: %w", dev, err)
	}
	var sfs unix.Statfs_t
	if err := unix.Statfs(filesDir, &sfs); err != nil {
		return fmt.Errorf("reserve room: statfs: %w", err)
	}
	bs := sfs.Bsize
	blocks := size * 512 / bs
	// The kernel's own reserve (2%, at most 4096 clusters:
	// ext4_calculate_resv_clusters), for writes it cannot let fail, such
	// as the conversion of unwritten extents; the kernel takes no more
	// than the image less one.
	clusters := min(blocks/50, 4096) + (bytes+bs-1)/bs
	clusters = min(clusters, blocks-1)
	attr := filepath.Join("/sys/fs/ext4", dev, "reserved_clusters")
	if err := os.WriteFile(attr, []byte(strconv.FormatInt(clusters, 10)), 0); err != nil {
		return fmt.Errorf("reserve room: %w", err)
	}
	return nil
}

func (l loopSpace) release(filesDir string) error {
	mounted, err := isMountPoint(filesDir)
	if err != nil || !mounted {
		return err
	}
	return unmount(filesDir)
}

// makeImage makes a sparse ext4 image of size bytes whose root belongs to
// uid:gid. Without a journal: it is a scratch space, and mkfs is quicker.
func makeImage(img string, size int64, uid, gid int) error {
	f, err := os.OpenFile(img, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fmt.Errorf("create disk image: %w", err)
	}
	err = f.Truncate(size)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = run("mkfs.ext4", "-q", "-F", "-m", "0", "-O", "^has_journal",
			"-E", fmt.Sprintf("root_owner=%d:%d,lazy_itable_init=1,nodiscard", uid, gid), img)
	}
	if err != nil {
		os.Remove(img)
		return fmt.Errorf("make disk image: %w", err)
	}
	return nil
}

// mountImage mounts an image. noinit_itable: the kernel would otherwise
// spend seconds of disk writes zeroing each new image's inode tables, which
// a scratch filesystem does not need.
func mountImage(img, dir string) error {
	if err := run("mount", "-o", "loop,nosuid,nodev,noinit_itable", img, dir); err != nil {
		return fmt.Errorf("mount disk image: %w", err)
	}
	return nil
}

func unmount(dir string) error {
	if err := run("umount", dir); err != nil {
		return fmt.Errorf("unmount: %w", err)
	}
	return nil
}

func run(name string, args ...string) error {
	out, err := exec.Command(name, args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("%s: %w: %s", name, err, strings.TrimSpace(string(out)))
	}
	return nil
}

// isMountPoint reports whether dir is a mount point.
func isMountPoint(dir string) (bool, error) {
	dir, err := filepath.Abs(dir)
	if err != nil {
		return false, err
	}
	mounted, err := mountinfo.Mounted(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	return mounted, err
}
