package kubernetes

import (
	"archive/tar"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/remotecommand"

	"github.com/runbox-dev/runbox/internal/agent"
	"github.com/runbox-dev/runbox/internal/sparse"
)

// A sandbox's /data is an emptyDir of its pod: the executor's working
// copy of the conversation's files (a folder on the executor's host, as
// for Docker) is copied in when the sandbox starts and, after each run,
// what the program left is copied back out, as tar over exec (the
// image's own tar, run as the programs' user: nothing runs as root). The
// pod gets no host path; the executor's folder is written only by the
// executor, through an os.Root, from an archive whose every name it
// checks (what a program leaves is hostile).

// ErrTooLarge reports files past the limit of a copy: a sandbox's /data
// that holds more than the quota CopyOut was given (nothing past it is
// copied), or a folder whose files take more than its sandbox's /data may
// hold (folderCopier: nothing is copied in).
var ErrTooLarge = errors.New("kubernetes: the sandbox's files exceed their quota")

// CopyIn replaces what the sandbox's /data holds with the folder dir:
// its folders, regular files and symbolic links.
func (e *Engine) CopyIn(ctx context.Context, name, dir string) error {
	pr, pw := io.Pipe()
	go func() { pw.CloseWithError(writeTar(pw, dir)) }()
	defer pr.Close()
	// find -delete first: the sandbox's copy is the folder's, nothing else.
	cmd := []string{"sh", "-c", `find "$0" -mindepth 1 -delete && exec tar -x --no-same-owner -C "$0" -f -`, DataDir}
	return e.exec(ctx, name, cmd, pr, io.Discard)
}

// writeTar writes the folder dir as a tar archive, names relative to it.
func writeTar(w io.Writer, dir string) error {
	tw := tar.NewWriter(w)
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil || path == dir {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		link := ""
		if info.Mode()&fs.ModeSymlink != 0 {
			if link, err = os.Readlink(path); err != nil {
				return err
			}
		} else if !info.Mode().IsRegular() && !info.IsDir() {
			return nil
		}
		hdr, err := tar.FileInfoHeader(info, link)
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, path)
		hdr.Name = filepath.ToSlash(rel)
		hdr.Uname, hdr.Gname, hdr.Uid, hdr.Gid = "", "", UID, GID
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if !info.Mode().IsRegular() {
			return nil
		}
		f, err := os.Open(path)
		if err != nil {
			return err
		}
		defer f.Close()
		_, err = io.CopyN(tw, f, info.Size())
		return err
	})
	if err != nil {
		return err
	}
	return tw.Close()
}

// CopyOut makes the folder dir hold what the sandbox's /data holds:
// folders, regular files (a file of the same size and time is left as
// it is) and symbolic links are written, and what /data no longer holds
// is removed from dir. At most q.Bytes bytes of files and q.Entries
// entries are taken (0: no bound); past either CopyOut fails with
// ErrTooLarge, and dir keeps only what it took (readTar).
func (e *Engine) CopyOut(ctx context.Context, name, dir string, q agent.Quota) error {
	root, err := os.OpenRoot(dir)
	if err != nil {
		return fmt.Errorf("kubernetes: open the working copy: %w", err)
	}
	defer root.Close()
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() {
		err := readTar(pr, root, q)
		if err == nil {
			// tar pads its archive past the end (to 10 KiB records): read
			// so that the exec's copy of it ends without an error logged.
			_, _ = io.Copy(io.Discard, io.LimitReader(pr, tarTail))
		}
		pr.CloseWithError(cmpErr(err, io.ErrClosedPipe))
		done <- err
	}()
	execErr := e.exec(ctx, name, []string{"tar", "-c", "-C", DataDir, "-f", "-", "."}, nil, pw)
	pw.CloseWithError(cmpErr(execErr, io.EOF))
	if err := <-done; err != nil {
		return err
	}
	return execErr
}

// tarTail bounds what is read of an archive past its end.
const tarTail = 1 << 20

// readTar writes the archive's entries into root and removes what it
// held that the archive does not. An archive past q (its agent did not
// stop its program there: one that does not measure, or a process the
// agent could not end) is taken up to it: root then holds only the
// entries written before, nothing it held besides, and so never more
// than q.
func readTar(r io.Reader, root *os.Root, q agent.Quota) error {
	tr := tar.NewReader(r)
	seen := map[string]bool{".": true}
	var total int64
	entries := 0
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			return fmt.Errorf("kubernetes: read the sandbox's files: %w", err)
		}
		name, ok := localName(hdr.Name)
		if !ok {
			return fmt.Errorf("kubernetes: the sandbox's archive holds the name %q", hdr.Name)
		}
		if name == "." {
			continue
		}
		if entries++; hdr.Typeflag == tar.TypeReg {
			total += hdr.Size
		}
		if q.Entries > 0 && entries > q.Entries || q.Bytes > 0 && total > q.Bytes {
			return errors.Join(ErrTooLarge, prune(root, seen))
		}
		written, err := writeEntry(root, name, hdr, tr)
		if err != nil {
			return fmt.Errorf("kubernetes: write %s: %w", name, err)
		}
		if written {
			seen[name] = true
		}
	}
	return prune(root, seen)
}

// localName is an archive's name as a path under the folder, if it is
// one.
func localName(name string) (string, bool) {
	name = filepath.Clean(strings.TrimPrefix(name, "./"))
	return name, filepath.IsLocal(name)
}

// writeEntry writes one entry; it reports whether the entry is kept
// (those of other types are not).
func writeEntry(root *os.Root, name string, hdr *tar.Header, r io.Reader) (bool, error) {
	old, err := root.Lstat(name)
	exists := err == nil
	switch hdr.Typeflag {
	case tar.TypeDir:
		if exists && !old.IsDir() {
			if err := root.Remove(name); err != nil {
				return false, err
			}
		}
		return true, root.MkdirAll(name, 0o755)
	case tar.TypeSymlink:
		if exists {
			if err := root.RemoveAll(name); err != nil {
				return false, err
			}
		}
		return true, root.Symlink(hdr.Linkname, name)
	case tar.TypeReg:
		if exists && old.Mode().IsRegular() && old.Size() == hdr.Size && old.ModTime().Equal(hdr.ModTime) {
			return true, nil
		}
		if exists && !old.Mode().IsRegular() {
			if err := root.RemoveAll(name); err != nil {
				return false, err
			}
		}
		// Not through a link: one the archive made earlier was removed
		// above, and O_NOFOLLOW refuses one made since.
		f, err := root.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_TRUNC|syscall.O_NOFOLLOW, fs.FileMode(hdr.Mode)&0o755|0o600)
		if err != nil {
			return false, err
		}
		// tar carries holes as zeros: blocks of them become holes again.
		n, err := sparse.Write(f, io.LimitReader(r, hdr.Size))
		if err == nil && n < hdr.Size {
			err = io.ErrUnexpectedEOF
		}
		if cerr := f.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return false, err
		}
		return true, root.Chtimes(name, hdr.ModTime, hdr.ModTime)
	}
	return false, nil
}

// prune removes from root what seen does not name, deepest first.
func prune(root *os.Root, seen map[string]bool) error {
	var gone []string
	err := fs.WalkDir(root.FS(), ".", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !seen[path] {
			gone = append(gone, path)
			if d.IsDir() {
				return fs.SkipDir
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("kubernetes: list the working copy: %w", err)
	}
	slices.Reverse(gone)
	for _, p := range gone {
		if err := root.RemoveAll(p); err != nil {
			return fmt.Errorf("kubernetes: remove %s: %w", p, err)
		}
	}
	return nil
}

// exec runs cmd in a sandbox's container with stdin (nil for none) and
// stdout; it fails if cmd does, with the start of what it wrote to
// stderr.
func (e *Engine) exec(ctx context.Context, name string, cmd []string, stdin io.Reader, stdout io.Writer) error {
	u := e.client.CoreV1().RESTClient().Post().
		Namespace(e.settings.Namespace).Resource("pods").Name(name).SubResource("exec").
		VersionedParams(&corev1.PodExecOptions{
			Container: Container, Command: cmd, Stdin: stdin != nil, Stdout: true, Stderr: true,
		}, scheme.ParameterCodec).URL()
	ex, err := e.executor(u)
	if err != nil {
		return err
	}
	var stderr bytes.Buffer
	err = ex.StreamWithContext(ctx, remotecommand.StreamOptions{Stdin: stdin, Stdout: stdout, Stderr: &limitedWriter{w: &stderr, n: 1024}})
	if err != nil {
		return fmt.Errorf("kubernetes: %s in pod %s: %w: %s", cmd[0], name, err, strings.TrimSpace(stderr.String()))
	}
	return nil
}

// limitedWriter keeps the first n bytes written to it.
type limitedWriter struct {
	w io.Writer
	n int
}

func (l *limitedWriter) Write(p []byte) (int, error) {
	if l.n > 0 {
		k := min(len(p), l.n)
		l.w.Write(p[:k])
		l.n -= k
	}
	return len(p), nil
}
