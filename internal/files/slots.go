package files

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/runbox-dev/runbox"
)

// A slot is a folder, bounded like a conversation's, made for a sandbox
// started before its conversation is known. When a new conversation's
// first run comes, the slot is renamed to the conversation's folder: a bind
// mount follows the directory, not its path, so the sandbox that mounts the
// slot mounts the conversation's folder from then on.

// slotsDir holds the slots; its name is no valid conversation id.
const slotsDir = ".pool"

func (f *Folders) slotDir(name string) string { return filepath.Join(f.root, slotsDir, name) }

// NewSlot makes a slot and returns the host path of its files folder.
// name must be a single path element.
func (f *Folders) NewSlot(name string) (string, error) {
	if err := validSlotName(name); err != nil {
		return "", err
	}
	dir := f.slotDir(name)
	if err := os.MkdirAll(dir, 0o711); err != nil {
		return "", fmt.Errorf("create slot: %w", err)
	}
	files := filepath.Join(dir, "files")
	if err := f.space.prepare(dir, files); err != nil {
		os.RemoveAll(dir)
		return "", err
	}
	return files, nil
}

// validSlotName checks that a slot's name is a single path element.
func validSlotName(name string) error {
	if name == "" || strings.ContainsAny(name, "/\x00") || name == "." || name == ".." {
		return fmt.Errorf("invalid slot name %q", name)
	}
	return nil
}

// ErrConversationExists reports a slot that cannot be adopted because the
// conversation has a folder already.
var ErrConversationExists = errors.New("the conversation has a folder")

// Adopt makes the slot whose files folder is slotFiles the folder of
// conversation cid, and returns the conversation's files folder. It fails
// with ErrConversationExists if cid has a folder (made meanwhile by an
// upload, say): the rename never replaces anything.
func (f *Folders) Adopt(slotFiles, cid string) (string, error) {
	if !runbox.ValidConversationKey(cid) {
		return "", runbox.Errorf(runbox.EInvalid, "invalid conversationId")
	}
	slot := filepath.Dir(slotFiles)
	if filepath.Dir(slot) != filepath.Join(f.root, slotsDir) {
		return "", fmt.Errorf("%s is not a slot", slotFiles)
	}
	err := unix.Renameat2(unix.AT_FDCWD, slot, unix.AT_FDCWD, f.convDir(cid), unix.RENAME_NOREPLACE)
	if errors.Is(err, unix.EEXIST) || errors.Is(err, unix.ENOTEMPTY) {
		return "", ErrConversationExists
	}
	if err != nil {
		return "", fmt.Errorf("adopt slot: %w", err)
	}
	return f.Path(cid), nil
}

// Exists reports whether a conversation has a folder.
func (f *Folders) Exists(cid string) bool {
	_, err := os.Lstat(f.convDir(cid))
	return err == nil
}

// RemoveSlots removes the slots whose names start with prefix (those of
// one executor, after it stopped or crashed).
func (f *Folders) RemoveSlots(prefix string) error {
	entries, err := os.ReadDir(filepath.Join(f.root, slotsDir))
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("list slots: %w", err)
	}
	var errs []error
	for _, e := range entries {
		if !strings.HasPrefix(e.Name(), prefix) {
			continue
		}
		dir := f.slotDir(e.Name())
		if err := f.space.release(filepath.Join(dir, "files")); err != nil {
			errs = append(errs, err)
			continue
		}
		if err := os.RemoveAll(dir); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// RemoveSlot removes one slot by its files folder.
func (f *Folders) RemoveSlot(slotFiles string) error {
	slot := filepath.Dir(slotFiles)
	if filepath.Dir(slot) != filepath.Join(f.root, slotsDir) {
		return fmt.Errorf("%s is not a slot", slotFiles)
	}
	if err := f.space.release(slotFiles); err != nil {
		return err
	}
	return os.RemoveAll(slot)
}

// ErrNotRecyclable reports a conversation whose sandbox is not handed to
// another: in loop mode, one whose files take more than MaxHandover.
var ErrNotRecyclable = errors.New("too many files to hand the sandbox over")

// Recycle takes the folder that conversation cid's idle sandbox mounts
// away from the conversation and makes it a new slot named name, empty,
// for that sandbox to serve a new conversation once reset; cid gets a new
// folder holding its files. It returns the slot's files folder. mounted
// says whether a folder is the one the sandbox mounts: a conversation
// whose folder was made anew since (closed, reopened) is not recycled. Nor
// is one used since idleSince (Ensure marks each use under the lock): a
// sandbox may be starting for it, here or on another executor, with the
// folder's path resolved to the folder about to become a slot.
//
// The sandbox's folder is first exchanged with an empty one in one step
// (renameat2 RENAME_EXCHANGE), so that from then on the conversation's
// path never names it, whatever starts meanwhile; then its entries move
// into the conversation's new folder, and the slot is checked empty.
// Nothing may run in the sandbox (the caller reset it).
func (f *Folders) Recycle(cid, name string, mounted func(dir string) bool, idleSince time.Time) (string, error) {
	unlock, err := f.lockValid(cid)
	if err != nil {
		return "", err
	}
	defer unlock()
	conv := f.Path(cid)
	if !mounted(conv) {
		return "", fmt.Errorf("recycle %s: its folder is not the sandbox's", cid)
	}
	if info, err := os.Stat(f.convDir(cid)); err != nil || info.ModTime().After(idleSince) {
		return "", fmt.Errorf("recycle %s: used since its sandbox went idle", cid)
	}
	if f.space.hard() {
		return f.recycleImage(cid, name)
	}
	slot, err := f.NewSlot(name)
	if err != nil {
		return "", err
	}
	if err := unix.Renameat2(unix.AT_FDCWD, conv, unix.AT_FDCWD, slot, unix.RENAME_EXCHANGE); err != nil {
		_ = f.RemoveSlot(slot)
		return "", fmt.Errorf("recycle %s: %w", cid, err)
	}
	// An upload under way may add an entry after a pass: passes go on
	// until none is left (the files themselves move with their open
	// handles).
	if err := drain(slot, conv); err != nil {
		// Put the conversation back as it was: its files in its folder.
		if berr := moveEntries(conv, slot); berr == nil {
			if xerr := unix.Renameat2(unix.AT_FDCWD, conv, unix.AT_FDCWD, slot, unix.RENAME_EXCHANGE); xerr == nil {
				_ = f.RemoveSlot(slot)
			}
		}
		return "", fmt.Errorf("recycle %s: %w", cid, err)
	}
	left, err := os.ReadDir(slot)
	if err != nil || len(left) > 0 {
		return "", fmt.Errorf("recycle %s: the slot is not empty (%d entries, %v)", cid, len(left), err)
	}
	return slot, nil
}

// moveEntries renames every entry of src into dst (one file system).
func moveEntries(src, dst string) error {
	entries, err := os.ReadDir(src)
	if err != nil {
		return err
	}
	for _, e := range entries {
		if err := os.Rename(filepath.Join(src, e.Name()), filepath.Join(dst, e.Name())); err != nil {
			return err
		}
	}
	return nil
}

// MoveInto gives conversation cid's files to the sandbox that mounts the
// slot slotFiles, for a conversation that has a folder but no sandbox: the
// files move into the slot's folder, which then takes the conversation's
// path (exchanged in one step), and the conversation's old folder, empty,
// goes with the slot. It returns the conversation's files folder. In loop
// mode the files are copied (moveIntoImage).
func (f *Folders) MoveInto(slotFiles, cid string) (string, error) {
	slot := filepath.Dir(slotFiles)
	if filepath.Dir(slot) != filepath.Join(f.root, slotsDir) {
		return "", fmt.Errorf("%s is not a slot", slotFiles)
	}
	unlock, err := f.lockValid(cid)
	if err != nil {
		return "", err
	}
	defer unlock()
	if f.space.hard() {
		return f.moveIntoImage(slotFiles, cid)
	}
	conv := f.Path(cid)
	if err := drain(conv, slotFiles); err != nil {
		_ = drain(slotFiles, conv)
		return "", fmt.Errorf("move %s into a sandbox: %w", cid, err)
	}
	if err := unix.Renameat2(unix.AT_FDCWD, slotFiles, unix.AT_FDCWD, conv, unix.RENAME_EXCHANGE); err != nil {
		_ = drain(slotFiles, conv)
		return "", fmt.Errorf("move %s into a sandbox: %w", cid, err)
	}
	// What an upload under way added to the old folder follows; the old
	// folder is removed only when empty.
	if err := drain(slotFiles, conv); err == nil && os.Remove(slotFiles) == nil {
		_ = os.Remove(slot)
	}
	return conv, nil
}

// drain moves every entry of src into dst, pass after pass while entries
// keep coming (an upload under way), and reports any left.
func drain(src, dst string) error {
	for range 3 {
		if err := moveEntries(src, dst); err != nil {
			return err
		}
		left, err := os.ReadDir(src)
		if err != nil {
			return err
		}
		if len(left) == 0 {
			return nil
		}
	}
	return fmt.Errorf("%s keeps getting new entries", src)
}
