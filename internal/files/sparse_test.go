package files

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/runbox-dev/runbox"
	"github.com/runbox-dev/runbox/internal/sparse/sparsetest"
)

// TestWalkCountsApparentSize: in walk mode a sparse file counts for its
// whole size, which every copy that cannot keep holes writes.
func TestWalkCountsApparentSize(t *testing.T) {
	f, dir := newFoldersIn(t, QuotaWalk)
	sparsetest.File(t, filepath.Join(dir, "big"), 64<<20)
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
				sparsetest.File(t, filepath.Join(src, "f"+string(rune('0'+i))), tt.size)
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
				sparsetest.Check(t, filepath.Join(f.Path("fork"), "f"+string(rune('0'+i))), tt.size)
			}
		})
	}
}

// TestHandoverKeepsHoles: a loop-mode hand-over copies a sparse file's
// data only, so a file far larger than the image and than MaxHandover,
// with little data, moves into a sandbox's image.
func TestHandoverKeepsHoles(t *testing.T) {
	f, dir := newFoldersIn(t, QuotaLoop)
	sparsetest.File(t, filepath.Join(dir, "big"), 4*MaxHandover)
	slot, err := f.NewSlot("ex-s1")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.MoveInto(slot, "conv1"); err != nil {
		t.Fatal(err)
	}
	sparsetest.Check(t, filepath.Join(f.Path("conv1"), "big"), 4*MaxHandover)
}
