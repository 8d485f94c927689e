package agent

import (
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"path/filepath"
	"syscall"
)

// dataSum returns a fingerprint of the folder dir: every entry's name,
// type and permissions, size, inode, and modification and change times,
// walked without following links. Writing a file, even to the same size
// and time (utimes sets the change time), renaming, linking or removing
// one changes the sum. "" when dir could not be walked whole: the engine
// then copies, as without a sum.
//
// A program may plant what makes its sandbox's sum repeat (it runs as
// the agent's user): it then keeps its own conversation's files from
// being copied out, nothing more — the sum decides only whether to copy
// out of the sandbox, never into it.
func dataSum(dir string) string {
	h := sha256.New()
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		st, ok := info.Sys().(*syscall.Stat_t)
		if !ok {
			return errors.New("no stat")
		}
		_, err = fmt.Fprintf(h, "%q %o %d %d %d.%d %d.%d\n", path, uint32(info.Mode()), info.Size(), st.Ino,
			st.Mtim.Sec, st.Mtim.Nsec, st.Ctim.Sec, st.Ctim.Nsec)
		return err
	})
	if err != nil {
		return ""
	}
	return hex.EncodeToString(h.Sum(nil))
}
