package files

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/runbox-dev/runbox"
)

// A conversation's saved interpreter state (internal/snapshot) is a file
// apart from its folder, which sandboxes mount and handovers move
// (slots.go): under stateDir, which names no conversation. It counts in
// the conversation's quota (Usage) and goes with it (Remove).
const stateDir = ".kept-state"

func (f *Folders) statePath(cid string) string { return filepath.Join(f.root, stateDir, cid) }

// stateSize returns the bytes of a conversation's saved state, 0 for none.
func (f *Folders) stateSize(cid string) int64 {
	info, err := os.Lstat(f.statePath(cid))
	if err != nil || !info.Mode().IsRegular() {
		return 0
	}
	return info.Size()
}

// PutState stores what r yields as the conversation's saved state, in
// place of the one it had, or fails past limit bytes, storing nothing.
func (f *Folders) PutState(_ context.Context, cid string, r io.Reader, limit int64) (int64, error) {
	if !runbox.ValidConversationKey(cid) {
		return 0, runbox.Errorf(runbox.EInvalid, "invalid conversationId")
	}
	if err := os.MkdirAll(filepath.Dir(f.statePath(cid)), 0o700); err != nil {
		return 0, fmt.Errorf("save state: %w", err)
	}
	tmp := f.statePath(cid) + "." + strings.ToLower(rand.Text()[:8])
	out, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return 0, fmt.Errorf("save state: %w", err)
	}
	n, err := io.Copy(out, io.LimitReader(r, limit+1))
	if err == nil && n > limit {
		err = QuotaError(f.quota)
	}
	if cerr := out.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, f.statePath(cid))
	}
	if err != nil {
		os.Remove(tmp)
		return 0, err
	}
	return n, nil
}

// OpenState opens a conversation's saved state; ErrNotFound when none.
func (f *Folders) OpenState(_ context.Context, cid string) (io.ReadCloser, error) {
	if !runbox.ValidConversationKey(cid) {
		return nil, runbox.Errorf(runbox.EInvalid, "invalid conversationId")
	}
	file, err := os.Open(f.statePath(cid))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, ErrNotFound
	}
	return file, err
}

// RemoveState removes a conversation's saved state, if any.
func (f *Folders) RemoveState(_ context.Context, cid string) error {
	if !runbox.ValidConversationKey(cid) {
		return runbox.Errorf(runbox.EInvalid, "invalid conversationId")
	}
	if err := os.Remove(f.statePath(cid)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return nil
}

// StateRoom returns how many bytes a conversation's saved state may take:
// its quota less its files.
func (f *Folders) StateRoom(_ context.Context, cid string) (int64, error) {
	used, _, err := f.Usage(cid)
	if err != nil {
		return 0, err
	}
	return max(0, f.quota-used+f.stateSize(cid)), nil
}
