package files

import (
	"crypto/rand"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path"
	"strings"
	"syscall"

	"github.com/runbox-dev/runbox"
)

// PutFile is a file Put writes: a path relative to /data, which may name
// folders, and its content.
type PutFile struct {
	Name string
	Data []byte
}

// Put writes files into a conversation's folder, making the folders on
// their way, each file whole (written aside, then renamed over its name)
// and owned by the sandbox user. Paths go through os.Root: none leaves the
// folder, whatever links a program left there. All of them must fit the
// quota, else nothing is written.
//
// It holds the conversation's lock, as Write does.
func (f *Folders) Put(cid string, files []PutFile) error {
	for i, pf := range files {
		name, err := runbox.CleanFileName(pf.Name)
		if err != nil {
			return err
		}
		files[i].Name = name
	}
	unlock, err := f.lockValid(cid)
	if err != nil {
		return err
	}
	defer unlock()
	dir, err := f.ensureLocked(cid)
	if err != nil {
		return err
	}
	root, err := os.OpenRoot(dir)
	if err != nil {
		return fmt.Errorf("open conversation folder: %w", err)
	}
	defer root.Close()
	_, free, err := f.space.usage(dir)
	if err != nil {
		return fmt.Errorf("measure conversation folder: %w", err)
	}
	var need int64
	for _, pf := range files {
		need += int64(len(pf.Data))
		if info, err := root.Lstat(pf.Name); err == nil && info.Mode().IsRegular() {
			need -= info.Size()
		}
	}
	if need > free {
		return runbox.FileQuotaError(f.quota)
	}
	for _, pf := range files {
		if err := f.put(root, pf); err != nil {
			return err
		}
	}
	return nil
}

func (f *Folders) put(root *os.Root, pf PutFile) error {
	if err := f.mkdirs(root, path.Dir(pf.Name)); err != nil {
		return err
	}
	if info, err := root.Lstat(pf.Name); err == nil && info.IsDir() {
		return runbox.Errorf(runbox.EInvalidPath, "%s is a folder", pf.Name)
	}
	tmp := path.Join(path.Dir(pf.Name), UploadPrefix+strings.ToLower(rand.Text()[:12]))
	out, err := root.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return fmt.Errorf("create file: %w", err)
	}
	defer root.Remove(tmp) // gone once renamed; cleanup otherwise
	_, err = out.Write(pf.Data)
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	if errors.Is(err, syscall.ENOSPC) || errors.Is(err, syscall.EDQUOT) {
		return runbox.FileQuotaError(f.quota)
	}
	if err != nil {
		return fmt.Errorf("write file: %w", err)
	}
	_ = root.Lchown(tmp, f.uid, f.gid) // so that programs may change it
	if err := root.Rename(tmp, pf.Name); err != nil {
		return fmt.Errorf("store file: %w", err)
	}
	return nil
}

// mkdirs makes the folders of dir (relative, clean) that are missing,
// owned by the sandbox user. A part that exists and is not a folder is
// refused.
func (f *Folders) mkdirs(root *os.Root, dir string) error {
	if dir == "." {
		return nil
	}
	p := ""
	for seg := range strings.SplitSeq(dir, "/") {
		p = path.Join(p, seg)
		err := root.Mkdir(p, 0o755)
		switch {
		case err == nil:
			_ = root.Lchown(p, f.uid, f.gid)
		case errors.Is(err, fs.ErrExist):
			info, err := root.Stat(p)
			if err != nil || !info.IsDir() {
				return runbox.Errorf(runbox.EInvalidPath, "%s is not a folder", p)
			}
		case isEscape(err):
			return runbox.Errorf(runbox.EInvalidPath, "%s leads out of the conversation's folder", p)
		default:
			return fmt.Errorf("make folder: %w", err)
		}
	}
	return nil
}
