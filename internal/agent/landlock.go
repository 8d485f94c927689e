package agent

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"
)

// A run's filesystem rules (Rules) are held by Landlock, the kernel's
// own access control that an unprivileged process applies to itself and
// everything it starts, for good. The agent starts such a run's program
// through itself (LandlockFlag): the new process applies the rules, then
// execs the program.
//
// Landlock only grants: a ruleset names the accesses it handles, and each
// rule allows some of them beneath a file or folder. What is denied is
// therefore what no rule allows: "everything but P" is every entry of
// each folder on the way to P but the one leading to it, so the folders
// on that way get no rights of their own (their entries cannot be listed,
// for reads, nor made or removed, for writes). Rules hold to inodes:
// renaming or linking a file elsewhere never gives it rights it lacks
// (REFER is handled, and Landlock refuses a move that would widen a
// file's access).

// MinLandlockABI is the Landlock ABI the rules need: REFER (2), and
// TRUNCATE (3) so that a file that may not be written cannot be
// truncated either.
const MinLandlockABI = 3

// LandlockFlag, as the agent's first argument, makes it apply the rules
// that follow and exec the program after "--" (LandlockExec).
const LandlockFlag = "-landlock-exec"

// Rules narrow what a program may read and write. Paths are absolute.
type Rules struct {
	// AllowWrite, when not nil, are the only places it may write.
	AllowWrite []string `json:"allow_write"`
	DenyRead   []string `json:"deny_read,omitempty"`
	DenyWrite  []string `json:"deny_write,omitempty"`
}

const (
	accessRead  = unix.LANDLOCK_ACCESS_FS_READ_FILE | unix.LANDLOCK_ACCESS_FS_READ_DIR
	accessWrite = unix.LANDLOCK_ACCESS_FS_WRITE_FILE | unix.LANDLOCK_ACCESS_FS_TRUNCATE |
		unix.LANDLOCK_ACCESS_FS_REMOVE_DIR | unix.LANDLOCK_ACCESS_FS_REMOVE_FILE |
		unix.LANDLOCK_ACCESS_FS_MAKE_CHAR | unix.LANDLOCK_ACCESS_FS_MAKE_DIR | unix.LANDLOCK_ACCESS_FS_MAKE_REG |
		unix.LANDLOCK_ACCESS_FS_MAKE_SOCK | unix.LANDLOCK_ACCESS_FS_MAKE_FIFO | unix.LANDLOCK_ACCESS_FS_MAKE_BLOCK |
		unix.LANDLOCK_ACCESS_FS_MAKE_SYM
	// accessFile are the rights a rule on a file (not a folder) may hold.
	accessFile = unix.LANDLOCK_ACCESS_FS_EXECUTE | unix.LANDLOCK_ACCESS_FS_READ_FILE |
		unix.LANDLOCK_ACCESS_FS_WRITE_FILE | unix.LANDLOCK_ACCESS_FS_TRUNCATE
)

// writableDevices may be written whatever the rules: where shells send
// what they discard, and the terminal.
var writableDevices = []string{"/dev/null", "/dev/zero", "/dev/full", "/dev/tty"}

// maxRules bounds the rules one run's folders are split into.
const maxRules = 20000

// LandlockABI returns the Landlock ABI this kernel offers the caller, 0
// when none (an old kernel, Landlock off, a runtime without it such as
// gVisor, or a seccomp profile that refuses it).
func LandlockABI() int {
	abi, _, errno := unix.Syscall(unix.SYS_LANDLOCK_CREATE_RULESET, 0, 0, unix.LANDLOCK_CREATE_RULESET_VERSION)
	if errno != 0 {
		return 0
	}
	return int(abi)
}

// landlockCommand returns the command that runs argv under rules.
func landlockCommand(rules *Rules, argv []string) ([]string, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, fmt.Errorf("find the agent's binary: %w", err)
	}
	b, err := json.Marshal(rules)
	if err != nil {
		return nil, err
	}
	return append([]string{self, LandlockFlag, string(b), "--"}, argv...), nil
}

// LandlockExec applies the rules of args ("<rules> -- program args…")
// to this process and execs the program; it returns only on failure.
func LandlockExec(args []string) error {
	if len(args) < 3 || args[1] != "--" {
		return errors.New("usage: " + LandlockFlag + " <rules> -- program [args…]")
	}
	var rules Rules
	if err := json.Unmarshal([]byte(args[0]), &rules); err != nil {
		return fmt.Errorf("read the filesystem rules: %w", err)
	}
	if abi := LandlockABI(); abi < MinLandlockABI {
		return fmt.Errorf("the filesystem rules cannot be enforced: this sandbox's kernel offers Landlock ABI %d, they need %d", abi, MinLandlockABI)
	}
	// Places a program may be allowed to write exist before it runs.
	for _, p := range rules.AllowWrite {
		_ = os.MkdirAll(p, 0o755)
	}
	handled, grants, err := planRules(rules)
	if err != nil {
		return err
	}
	if handled&accessRead != 0 {
		// The program's own file is read by its interpreter.
		for _, a := range args[3:] {
			if filepath.IsAbs(a) {
				if st, err := os.Stat(a); err == nil && st.Mode().IsRegular() {
					grants[a] |= unix.LANDLOCK_ACCESS_FS_READ_FILE
				}
			}
		}
	}
	if err := restrict(handled, grants); err != nil {
		return err
	}
	prog, err := exec.LookPath(args[2])
	if err != nil {
		return err
	}
	return syscall.Exec(prog, args[2:], os.Environ())
}

// planRules returns what a ruleset handles and what it allows, by path.
func planRules(r Rules) (uint64, map[string]uint64, error) {
	var handled uint64
	grants := map[string]uint64{}
	budget := maxRules
	grant := func(paths []string, access uint64) {
		for _, p := range paths {
			grants[p] |= access
		}
	}
	if len(r.DenyRead) > 0 {
		handled |= accessRead | unix.LANDLOCK_ACCESS_FS_REFER
		allowed, err := complement([]string{"/"}, resolveAll(r.DenyRead), &budget)
		if err != nil {
			return 0, nil, err
		}
		grant(allowed, accessRead|unix.LANDLOCK_ACCESS_FS_REFER)
	}
	if r.AllowWrite != nil || len(r.DenyWrite) > 0 {
		handled |= accessWrite | unix.LANDLOCK_ACCESS_FS_REFER
		bases := []string{"/"}
		if r.AllowWrite != nil {
			bases = resolveAll(r.AllowWrite)
		}
		allowed, err := complement(bases, resolveAll(r.DenyWrite), &budget)
		if err != nil {
			return 0, nil, err
		}
		grant(allowed, accessWrite|unix.LANDLOCK_ACCESS_FS_REFER)
		for _, d := range writableDevices {
			if _, err := os.Stat(d); err == nil {
				grants[d] |= unix.LANDLOCK_ACCESS_FS_WRITE_FILE | unix.LANDLOCK_ACCESS_FS_TRUNCATE
			}
		}
	}
	return handled, grants, nil
}

// resolveAll returns each path with its symbolic links resolved as far as
// it exists: a rule holds to what a path names, not to its spelling.
func resolveAll(paths []string) []string {
	out := make([]string, 0, len(paths))
	for _, p := range paths {
		out = append(out, resolve(filepath.Clean(p)))
	}
	return out
}

func resolve(p string) string {
	if r, err := filepath.EvalSymlinks(p); err == nil {
		return r
	}
	if p == "/" {
		return p
	}
	return filepath.Join(resolve(filepath.Dir(p)), filepath.Base(p))
}

// complement returns paths that together cover what is beneath bases but
// not beneath any of denied: a base with nothing denied beneath it
// whole, one holding a denied path split into its entries, recursively.
// Symbolic links among the entries are left out: what they point to is
// covered (or not) where it lives. An entry that cannot be listed is left
// out whole, which denies more, never less.
func complement(bases, denied []string, budget *int) ([]string, error) {
	var out []string
	for _, base := range bases {
		switch {
		case slices.ContainsFunc(denied, func(d string) bool { return within(base, d) }):
			// Denied itself, or beneath something denied.
		case !slices.ContainsFunc(denied, func(d string) bool { return within(d, base) }):
			if *budget--; *budget < 0 {
				return nil, errors.New("the filesystem rules split into too many entries")
			}
			out = append(out, base)
		default:
			entries, err := os.ReadDir(base)
			if err != nil {
				continue
			}
			var children []string
			for _, e := range entries {
				if e.Type()&os.ModeSymlink != 0 {
					continue
				}
				children = append(children, filepath.Join(base, e.Name()))
			}
			more, err := complement(children, denied, budget)
			if err != nil {
				return nil, err
			}
			out = append(out, more...)
		}
	}
	return out, nil
}

// within reports whether p is root or beneath it.
func within(p, root string) bool {
	return p == root || root == "/" || strings.HasPrefix(p, root+"/")
}

// restrict applies a ruleset to this process (and all it starts).
func restrict(handled uint64, grants map[string]uint64) error {
	attr := unix.LandlockRulesetAttr{Access_fs: handled}
	fd, _, errno := unix.Syscall(unix.SYS_LANDLOCK_CREATE_RULESET, uintptr(unsafe.Pointer(&attr)), unsafe.Sizeof(attr), 0)
	if errno != 0 {
		return fmt.Errorf("create a Landlock ruleset: %w", errno)
	}
	defer unix.Close(int(fd))
	paths := make([]string, 0, len(grants))
	for p := range grants {
		paths = append(paths, p)
	}
	slices.Sort(paths)
	for _, p := range paths {
		f, err := unix.Open(p, unix.O_PATH|unix.O_CLOEXEC|unix.O_NOFOLLOW, 0)
		if err != nil {
			continue // gone since it was listed: nothing to allow
		}
		access := grants[p] & handled
		var st unix.Stat_t
		if unix.Fstat(f, &st) == nil && st.Mode&unix.S_IFMT != unix.S_IFDIR {
			access &= accessFile
		}
		var errno syscall.Errno
		if access != 0 {
			rule := unix.LandlockPathBeneathAttr{Allowed_access: access, Parent_fd: int32(f)}
			_, _, errno = unix.Syscall6(unix.SYS_LANDLOCK_ADD_RULE, fd, unix.LANDLOCK_RULE_PATH_BENEATH,
				uintptr(unsafe.Pointer(&rule)), 0, 0, 0)
		}
		unix.Close(f)
		if errno != 0 {
			return fmt.Errorf("allow %s: %w", p, errno)
		}
	}
	if err := unix.Prctl(unix.PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0); err != nil {
		return fmt.Errorf("set no_new_privs: %w", err)
	}
	if _, _, errno := unix.Syscall(unix.SYS_LANDLOCK_RESTRICT_SELF, fd, 0, 0); errno != 0 {
		return fmt.Errorf("apply the Landlock ruleset: %w", errno)
	}
	return nil
}
