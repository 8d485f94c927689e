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
	"strconv"
	"strings"

	"github.com/runbox-dev/runbox"
)

// A conversation's saved interpreter state (internal/snapshot) is a file
// apart from its folder, which sandboxes mount and handovers move
// (slots.go): under stateDir, which names no conversation. It counts in
// the conversation's quota (Usage) and goes with it (Remove). While it is
// saved, what the sandbox may write is the quota less the state: in loop
// mode the conversation's image holds the state's room out of every
// writer's reach (space.reserve); in walk mode the executor's checks
// count it (Usage).
//
// Where the state is kept in a remote store (S3, the executor's folders
// being working copies), the working copy records its size (HoldState)
// beside, as <cid>.remote (no id has a dot), and it counts the same.
const stateDir = ".kept-state"

func (f *Folders) statePath(cid string) string { return filepath.Join(f.root, stateDir, cid) }

func (f *Folders) remoteStatePath(cid string) string { return f.statePath(cid) + ".remote" }

// stateSize returns the bytes of a conversation's saved state, here or in
// a remote store, 0 for none.
func (f *Folders) stateSize(cid string) int64 {
	var size int64
	if info, err := os.Lstat(f.statePath(cid)); err == nil && info.Mode().IsRegular() {
		size = info.Size()
	}
	if b, err := os.ReadFile(f.remoteStatePath(cid)); err == nil {
		if n, err := strconv.ParseInt(string(b), 10, 64); err == nil && n > 0 {
			size += n
		}
	}
	return size
}

// HoldState records that the conversation's saved state, kept in a
// remote store, takes size bytes (0: it has none), so that its folder
// leaves that room of its quota to it.
func (f *Folders) HoldState(cid string, size int64) error {
	if !runbox.ValidConversationKey(cid) {
		return runbox.Errorf(runbox.EInvalid, "invalid conversationId")
	}
	var err error
	if size > 0 {
		err = writeAtomic(f.remoteStatePath(cid), []byte(strconv.FormatInt(size, 10)))
	} else if err = os.Remove(f.remoteStatePath(cid)); errors.Is(err, fs.ErrNotExist) {
		err = nil
	}
	if err != nil {
		return fmt.Errorf("record the saved state's size: %w", err)
	}
	return f.reserveState(cid)
}

// writeAtomic replaces the file name with one that holds b.
func writeAtomic(name string, b []byte) error {
	if err := os.MkdirAll(filepath.Dir(name), 0o700); err != nil {
		return err
	}
	tmp := name + "." + strings.ToLower(rand.Text()[:8])
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return err
	}
	if err := os.Rename(tmp, name); err != nil {
		os.Remove(tmp)
		return err
	}
	return nil
}

// reserveState makes the conversation's image, if mounted, hold the room
// of its saved state as it is now (Ensure does at each use), under its
// lock so that two changes of the state apply in their order.
func (f *Folders) reserveState(cid string) error {
	if !f.space.hard() || !f.Exists(cid) {
		return nil
	}
	unlock, err := f.lock(cid)
	if err != nil {
		return err
	}
	defer unlock()
	return f.space.reserve(f.Path(cid), f.stateSize(cid))
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
		err = runbox.FileQuotaError(f.quota)
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
	if err := f.reserveState(cid); err != nil {
		// A state the sandbox could write over is not kept.
		return 0, errors.Join(err, f.removeState(cid))
	}
	return n, nil
}

// OpenState opens a conversation's saved state; runbox.ErrFileNotFound when none.
func (f *Folders) OpenState(_ context.Context, cid string) (io.ReadCloser, error) {
	if !runbox.ValidConversationKey(cid) {
		return nil, runbox.Errorf(runbox.EInvalid, "invalid conversationId")
	}
	file, err := os.Open(f.statePath(cid))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, runbox.ErrFileNotFound
	}
	return file, err
}

// RemoveState removes a conversation's saved state, if any, and gives its
// room back to the sandbox.
func (f *Folders) RemoveState(_ context.Context, cid string) error {
	if !runbox.ValidConversationKey(cid) {
		return runbox.Errorf(runbox.EInvalid, "invalid conversationId")
	}
	if err := f.removeState(cid); err != nil {
		return err
	}
	return f.reserveState(cid)
}

// removeState removes a conversation's saved state and the record of a
// remote one.
func (f *Folders) removeState(cid string) error {
	var errs []error
	for _, p := range []string{f.statePath(cid), f.remoteStatePath(cid)} {
		if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
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
