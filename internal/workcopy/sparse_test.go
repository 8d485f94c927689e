package workcopy

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/runbox-dev/runbox"
	"github.com/runbox-dev/runbox/internal/sparse/sparsetest"
)

// TestCopiesAndSparseFiles: the store counts every file whole (S3 has no
// holes), and so do the copies. A push of sparse files past the quota —
// six of a mebibyte with 8 KiB of data each, against a mebibyte — sends
// nothing, and the next pull drops them; one within it is sent, and
// another executor's pull writes its zeros as holes; a pull of a store
// past the quota fetches nothing.
func TestCopiesAndSparseFiles(t *testing.T) {
	ctx := context.Background()
	s3, versions := stores(t)
	a, b := newExecutor(t, s3, versions), newExecutor(t, s3, versions)
	const cid = "sparse"
	pushSparse := func(e executor, files int, size int64) error {
		dir, err := e.folders.Ensure(cid)
		if err != nil {
			t.Fatal(err)
		}
		if err := e.copies.Pull(ctx, cid, false); err != nil {
			t.Fatal(err)
		}
		before, _ := e.folders.List(cid)
		for i := range files {
			sparsetest.File(t, filepath.Join(dir, fmt.Sprintf("f%d", i)), size)
		}
		after, _ := e.folders.List(cid)
		return e.copies.Push(ctx, cid, before, after)
	}

	if err := pushSparse(a, 6, 1<<20-4096); runbox.ErrorCode(err) != runbox.EQuotaExceeded {
		t.Fatalf("push of 6 MiB of sparse files against 1 MiB: %v", err)
	}
	if got, _ := s3.Usage(ctx, cid); got != 0 {
		t.Fatalf("a refused push stored %d bytes", got)
	}
	a.run(t, cid, func(dir string) {
		if got := tree(t, dir); got != "" {
			t.Errorf("the copy kept what the store did not take: %d bytes", len(got))
		}
	})

	if err := pushSparse(a, 1, 900<<10); err != nil {
		t.Fatal(err)
	}
	b.run(t, cid, func(dir string) { sparsetest.Check(t, filepath.Join(dir, "f0"), 900<<10) })

	// Past the quota in the store (written behind its back).
	if _, err := s3.Put(ctx, cid, "big", bytes.NewReader(make([]byte, 200<<10)), 200<<10); err != nil {
		t.Fatal(err)
	}
	if _, _, err := versions.FilesChanged(ctx, cid, -1, time.Now()); err != nil {
		t.Fatal(err)
	}
	if err := b.copies.Pull(ctx, cid, false); runbox.ErrorCode(err) != runbox.EQuotaExceeded {
		t.Fatalf("pull of a store past the quota: %v", err)
	}
	if _, err := os.Lstat(filepath.Join(b.folders.Path(cid), "big")); err == nil {
		t.Error("a refused pull fetched a file")
	}
}
