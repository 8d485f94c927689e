package files

import (
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"strings"
	"syscall"

	"github.com/runbox-dev/runbox"
)

// UploadPrefix names files being written; listings skip them.
const UploadPrefix = ".upload-"

// Write stores what r yields (at most limit bytes) as a conversation's
// file. The file appears whole or not at all; without overwrite an
// existing name is an error, even if it appeared meanwhile.
//
// It holds the conversation's lock throughout: a sandbox's folder handed
// to another conversation (Recycle) is taken away under the same lock, so
// an upload never lands in a folder that has changed hands.
func (f *Folders) Write(cid, name string, r io.Reader, limit int64, overwrite bool) (Entry, error) {
	if !runbox.ValidFileName(name) {
		return Entry{}, runbox.ErrFileName
	}
	unlock, err := f.lockValid(cid)
	if err != nil {
		return Entry{}, err
	}
	defer unlock()
	dir, err := f.ensureLocked(cid)
	if err != nil {
		return Entry{}, err
	}
	root, err := os.OpenRoot(dir)
	if err != nil {
		return Entry{}, fmt.Errorf("open conversation folder: %w", err)
	}
	defer root.Close()

	existing, err := root.Lstat(name)
	switch {
	case err == nil && !overwrite:
		return Entry{}, runbox.FileExistsError(name)
	case err == nil && !existing.Mode().IsRegular():
		return Entry{}, runbox.Errorf(runbox.EFileExists, "%s exists and is not a regular file", name)
	case err != nil && !errors.Is(err, fs.ErrNotExist):
		return Entry{}, fmt.Errorf("inspect file: %w", err)
	}
	_, free, err := f.usage(cid)
	if err != nil {
		return Entry{}, fmt.Errorf("measure conversation folder: %w", err)
	}
	if existing != nil {
		free += existing.Size()
	}

	tmp := UploadPrefix + strings.ToLower(rand.Text()[:12])
	out, err := root.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return Entry{}, fmt.Errorf("create file: %w", err)
	}
	defer root.Remove(tmp) // gone once renamed or linked; cleanup otherwise
	n, err := io.Copy(out, io.LimitReader(r, min(limit, free)+1))
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	switch {
	case errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT):
		return Entry{}, runbox.FileQuotaError(f.quota)
	case err != nil:
		return Entry{}, fmt.Errorf("write file: %w", err)
	case n > limit:
		return Entry{}, runbox.FileTooLargeError(limit)
	case n > free:
		return Entry{}, runbox.FileQuotaError(f.quota)
	}
	_ = root.Lchown(tmp, f.uid, f.gid) // so that programs may change it
	if overwrite {
		err = root.Rename(tmp, name)
	} else {
		err = root.Link(tmp, name)
		if errors.Is(err, fs.ErrExist) {
			return Entry{}, runbox.FileExistsError(name)
		}
	}
	if err != nil {
		return Entry{}, fmt.Errorf("store file: %w", err)
	}
	info, err := root.Lstat(name)
	if err != nil {
		return Entry{}, fmt.Errorf("store file: %w", err)
	}
	return Entry{Name: name, Size: info.Size(), ModTime: info.ModTime()}, nil
}
