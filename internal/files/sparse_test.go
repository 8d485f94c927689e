package files

import (
	"context"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/runbox-dev/runbox"
)

// sparseFile makes a file of size bytes whose only data is a block at its
// start and one at its end: a program's truncate or seek.
func sparseFile(t *testing.T, p string, size int64) {
	t.Helper()
	f, err := os.Create(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := f.Truncate(size); err != nil {
		t.Fatal(err)
	}
	for _, off := range []int64{0, size - 4096} {
		if _, err := f.WriteAt([]byte("data"), off); err != nil {
			t.Fatal(err)
		}
	}
}

// blocks returns the bytes of the blocks a file takes.
func blocks(t *testing.T, p string) int64 {
	t.Helper()
	var st syscall.Stat_t
	if err := syscall.Stat(p, &st); err != nil {
		t.Fatal(err)
	}
	return st.Blocks * 512
}

// checkSparseCopy checks that the file p is a copy of a sparseFile of
// size bytes that kept its holes.
func checkSparseCopy(t *testing.T, p string, size int64) {
	t.Helper()
	info, err := os.Stat(p)
	if err != nil || info.Size() != size {
		t.Fatalf("the copy: %v, %v; want %d bytes", info, err, size)
	}
	if b := blocks(t, p); b > 64<<10 {
		t.Errorf("the copy of a file with 8 KiB of data takes %d bytes of blocks: its holes were filled", b)
	}
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, 4)
	for _, off := range []int64{0, size - 4096} {
		if _, err := f.ReadAt(buf, off); err != nil || string(buf) != "data" {
			t.Errorf("at %d the copy holds %q (%v)", off, buf, err)
		}
	}
}

// TestWalkCountsApparentSize: in walk mode a sparse file counts for its
// whole size, which every copy that cannot keep holes writes.
func TestWalkCountsApparentSize(t *testing.T) {
	f, dir := newFoldersIn(t, QuotaWalk)
	sparseFile(t, filepath.Join(dir, "big"), 64<<20)
	used, free, err := f.Usage("conv1")
	if err != nil {
		t.Fatal(err)
	}
	if used < 64<<20 || free != 0 {
		t.Errorf("a file of 64 MiB with 8 KiB of data counts for %d bytes (%d free) of an 8 MiB quota", used, free)
	}
}

// TestForkSparse: a fork is measured as its quota counts before anything
// is made — apparent sizes in walk mode, blocks in loop mode — and a
// source past the quota is refused with nothing written; one within it is
// copied with its holes kept.
func TestForkSparse(t *testing.T) {
	tests := []struct {
		name  string
		mode  QuotaMode
		files int   // sparse files in the source
		size  int64 // the apparent size of each; the quota is 8 MiB
		fits  bool
	}{
		{"walk: apparent sizes past the quota", QuotaWalk, 6, 4 << 20, false},
		{"walk: apparent sizes within the quota", QuotaWalk, 1, 6 << 20, true},
		{"loop: the image counts blocks", QuotaLoop, 6, 64 << 20, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f, src := newFoldersIn(t, tt.mode)
			for i := range tt.files {
				sparseFile(t, filepath.Join(src, "f"+string(rune('0'+i))), tt.size)
			}
			got, err := f.Fork(context.Background(), "conv1", "fork")
			if !tt.fits {
				if runbox.ErrorCode(err) != runbox.EQuotaExceeded {
					t.Fatalf("fork past the quota: %+v, %v", got, err)
				}
				if f.Exists("fork") {
					t.Error("a refused fork made its folder")
				}
				if entries, _ := os.ReadDir(filepath.Join(f.Root(), forksDir)); len(entries) != 0 {
					t.Errorf("a refused fork made a staging folder: %v", entries)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			for i := range tt.files {
				checkSparseCopy(t, filepath.Join(f.Path("fork"), "f"+string(rune('0'+i))), tt.size)
			}
		})
	}
}

// TestHandoverKeepsHoles: a loop-mode hand-over copies a sparse file's
// data only, so a file far larger than the image and than MaxHandover,
// with little data, moves into a sandbox's image.
func TestHandoverKeepsHoles(t *testing.T) {
	f, dir := newFoldersIn(t, QuotaLoop)
	sparseFile(t, filepath.Join(dir, "big"), 4*MaxHandover)
	slot, err := f.NewSlot("ex-s1")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.MoveInto(slot, "conv1"); err != nil {
		t.Fatal(err)
	}
	checkSparseCopy(t, filepath.Join(f.Path("conv1"), "big"), 4*MaxHandover)
}
