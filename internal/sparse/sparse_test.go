package sparse

import (
	"bytes"
	"errors"
	"io"
	"os"
	"path/filepath"
	"syscall"
	"testing"
	"testing/iotest"
)

// extent is data written at an offset of a file.
type extent struct {
	off  int64
	data string
}

// makeFile makes a file of size bytes holding extents, the rest holes.
func makeFile(t *testing.T, size int64, extents ...extent) *os.File {
	t.Helper()
	f, err := os.Create(filepath.Join(t.TempDir(), "src"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	if err := f.Truncate(size); err != nil {
		t.Fatal(err)
	}
	for _, e := range extents {
		if _, err := f.WriteAt([]byte(e.data), e.off); err != nil {
			t.Fatal(err)
		}
	}
	return f
}

func newFile(t *testing.T) *os.File {
	t.Helper()
	f, err := os.Create(filepath.Join(t.TempDir(), "dst"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { f.Close() })
	return f
}

// allocated returns the bytes of the blocks a file takes.
func allocated(t *testing.T, f *os.File) int64 {
	t.Helper()
	var st syscall.Stat_t
	if err := syscall.Fstat(int(f.Fd()), &st); err != nil {
		t.Fatal(err)
	}
	return st.Blocks * 512
}

func content(t *testing.T, f *os.File) []byte {
	t.Helper()
	b, err := os.ReadFile(f.Name())
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestCopy(t *testing.T) {
	tests := []struct {
		name    string
		size    int64
		extents []extent
		budget  int64
		err     error
	}{
		{"holes around data", 8 << 20, []extent{{0, "head"}, {3 << 20, "middle"}, {8<<20 - 4, "tail"}}, 1 << 20, nil},
		{"a hole and nothing else", 16 << 20, nil, 0, nil},
		{"no holes", 3 * block, []extent{{0, string(bytes.Repeat([]byte{'x'}, 3*block))}}, 3 * block, nil},
		{"data past the budget", 8 << 20, []extent{{0, "a"}, {4 << 20, "b"}}, block, ErrBudget},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			src, dst := makeFile(t, tt.size, tt.extents...), newFile(t)
			written, err := Copy(dst, src, tt.size, tt.budget)
			if !errors.Is(err, tt.err) {
				t.Fatalf("Copy: %v, want %v", err, tt.err)
			}
			if written > tt.budget {
				t.Errorf("wrote %d bytes past a budget of %d", written, tt.budget)
			}
			if tt.err != nil {
				return
			}
			if !bytes.Equal(content(t, dst), content(t, src)) {
				t.Error("the copy differs from its source")
			}
			if a, b := allocated(t, dst), allocated(t, src); a > b {
				t.Errorf("the copy takes %d bytes of blocks, its source %d", a, b)
			}
		})
	}
}

func TestWrite(t *testing.T) {
	data := make([]byte, 1<<20+100) // a partial block at the end
	copy(data[5*block:], "data")
	copy(data[len(data)-3:], "end")
	tests := []struct {
		name string
		r    func() io.Reader
	}{
		{"whole chunks", func() io.Reader { return bytes.NewReader(data) }},
		{"a byte at a time", func() io.Reader { return iotest.OneByteReader(bytes.NewReader(data)) }},
		{"half reads", func() io.Reader { return iotest.HalfReader(bytes.NewReader(data)) }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dst := newFile(t)
			n, err := Write(dst, tt.r())
			if err != nil || n != int64(len(data)) {
				t.Fatalf("Write: %d, %v", n, err)
			}
			if !bytes.Equal(content(t, dst), data) {
				t.Error("the file differs from what was written")
			}
			if a := allocated(t, dst); a > 4*block {
				t.Errorf("%d bytes of zeros take %d bytes of blocks", len(data), a)
			}
		})
	}
	// Zeros at the end still make the file's size.
	dst := newFile(t)
	if n, err := Write(dst, bytes.NewReader(make([]byte, 3*block+1))); err != nil || n != 3*block+1 {
		t.Fatalf("Write of zeros: %d, %v", n, err)
	}
	if info, _ := dst.Stat(); info.Size() != 3*block+1 || allocated(t, dst) != 0 {
		t.Errorf("zeros: size %d, %d bytes of blocks", info.Size(), allocated(t, dst))
	}
}
