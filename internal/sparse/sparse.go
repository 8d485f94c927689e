// Package sparse copies files without filling their holes.
//
// A file's holes take no room on its disk, and a program makes one with a
// seek or a truncate: a file of a terabyte may hold 4 KiB of data. A copy
// that reads such a file and writes what it read writes every hole out as
// zeros, so a conversation's few kilobytes became gigabytes on the host
// when it was forked. Copy writes only the data its source holds
// (SEEK_DATA, SEEK_HOLE); Write, for a source that cannot tell its holes
// (an S3 object, a tar stream), leaves each block of zeros a hole.
package sparse

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"syscall"

	"golang.org/x/sys/unix"
)

// ErrBudget reports a copy that would write more than its budget: it
// stopped before the range that would pass it.
var ErrBudget = errors.New("sparse: the copy would write more than its budget")

// Copy makes dst, an empty file, a copy of the first size bytes of src
// and returns the bytes it wrote: only src's data, the ranges SEEK_DATA
// and SEEK_HOLE find, each copied with copy_file_range where the kernel
// can (io.Copy between files, at their offsets); the holes between are
// left unwritten, and dst's size is set at the end. It writes no range
// that would take it past budget bytes (ErrBudget). Where the file system
// cannot tell data from holes, what is left is written as Write writes.
func Copy(dst, src *os.File, size, budget int64) (int64, error) {
	var written int64
	for off := int64(0); off < size; {
		start, err := src.Seek(off, unix.SEEK_DATA)
		if errors.Is(err, syscall.ENXIO) {
			break // no data past off: the rest is a hole
		}
		if errors.Is(err, syscall.EINVAL) {
			_, n, err := writeAt(dst, io.NewSectionReader(src, off, size-off), off, budget-written)
			return written + n, err
		}
		if err != nil {
			return written, fmt.Errorf("sparse: find data: %w", err)
		}
		if start >= size {
			break
		}
		end, err := src.Seek(start, unix.SEEK_HOLE)
		if err != nil {
			return written, fmt.Errorf("sparse: find a hole: %w", err)
		}
		end = min(end, size)
		if written+end-start > budget {
			return written, ErrBudget
		}
		if _, err := dst.Seek(start, io.SeekStart); err != nil {
			return written, err
		}
		if _, err := src.Seek(start, io.SeekStart); err != nil {
			return written, err
		}
		n, err := io.Copy(dst, io.LimitReader(src, end-start))
		written += n
		if err != nil {
			return written, err
		}
		off = end
	}
	return written, dst.Truncate(size)
}

// Write writes what r yields to dst, an empty file, from its start, and
// returns how many bytes that was: each block of zeros is left a hole, and
// dst's size is set at the end.
func Write(dst *os.File, r io.Reader) (int64, error) {
	size, _, err := writeAt(dst, r, 0, -1)
	return size, err
}

const (
	// block is the unit of zeros left a hole: a page, and the block of
	// the usual file systems (ext4, XFS).
	block = 4096
	// chunk is what is read at once.
	chunk = 64 * block
)

var zeros [block]byte

// writeAt writes what r yields at offset off of dst, leaving blocks of
// zeros unwritten, and sets dst's size to its end; it returns the bytes
// read and the bytes of data written, and writes none past budget bytes of
// data (ErrBudget; a negative budget is none).
func writeAt(dst *os.File, r io.Reader, off, budget int64) (size, written int64, err error) {
	buf := make([]byte, chunk)
	for {
		n, rerr := io.ReadFull(r, buf)
		// Each run of blocks that hold data is one write.
		for i := 0; i < n; {
			if isZero(buf[i:min(i+block, n)]) {
				i += block
				continue
			}
			j := min(i+block, n)
			for j < n && !isZero(buf[j:min(j+block, n)]) {
				j = min(j+block, n)
			}
			if budget >= 0 && written+int64(j-i) > budget {
				return size, written, ErrBudget
			}
			if _, err := dst.WriteAt(buf[i:j], off+size+int64(i)); err != nil {
				return size, written, err
			}
			written += int64(j - i)
			i = j
		}
		size += int64(n)
		if rerr == io.EOF || rerr == io.ErrUnexpectedEOF {
			return size, written, dst.Truncate(off + size)
		}
		if rerr != nil {
			return size, written, rerr
		}
	}
}

// isZero reports whether b, at most a block, holds only zeros.
func isZero(b []byte) bool { return bytes.Equal(b, zeros[:len(b)]) }
