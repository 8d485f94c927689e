// Package sparsetest makes sparse files for tests, as a program makes
// them: a truncate past the end, a write at a few offsets.
package sparsetest

import (
	"os"
	"syscall"
	"testing"
)

// Data is what File writes at the start of a file and 4 KiB before its
// end.
const Data = "data"

// File makes a file of size bytes (at least 8 KiB) at p whose only data
// is Data at its start and 4 KiB before its end: two blocks of data, the
// rest holes.
func File(t testing.TB, p string, size int64) {
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
		if _, err := f.WriteAt([]byte(Data), off); err != nil {
			t.Fatal(err)
		}
	}
}

// Check checks that the file at p is a copy of a File of size bytes that
// kept its holes: its data where File put it, and few blocks.
func Check(t testing.TB, p string, size int64) {
	t.Helper()
	f, err := os.Open(p)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var st syscall.Stat_t
	if err := syscall.Fstat(int(f.Fd()), &st); err != nil || st.Size != size {
		t.Fatalf("%s: %d bytes (%v), want %d", p, st.Size, err, size)
	}
	if st.Blocks*512 > 64<<10 {
		t.Errorf("%s, a copy of a file with 8 KiB of data, takes %d bytes of blocks: its holes were filled", p, st.Blocks*512)
	}
	buf := make([]byte, len(Data))
	for _, off := range []int64{0, size - 4096} {
		if _, err := f.ReadAt(buf, off); err != nil || string(buf) != Data {
			t.Errorf("%s holds %q at %d (%v), want %q", p, buf, off, err, Data)
		}
	}
}
