package envd

import (
	"errors"
	"io/fs"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"

	"connectrpc.com/connect"
	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/types/known/timestamppb"

	fspb "github.com/runbox-dev/runbox/internal/e2b/envdpb/filesystem"
)

// metadataPrefix is the extended attributes' namespace of a file's
// metadata (X-Metadata-* headers on upload, EntryInfo.metadata).
const metadataPrefix = "user.e2b."

// Bounds of a file's metadata, as E2B's envd holds them: a key within the
// VFS's xattr name limit less the prefix, and all of a file's keys and
// values within a budget an inode's xattrs fit in.
const (
	maxMetadataKey   = 255 - len(metadataPrefix)
	maxMetadataBytes = 4096
)

// names looks users' and groups' names up by id, once each.
type names struct {
	mu     sync.Mutex
	users  map[uint32]string
	groups map[uint32]string
}

func (n *names) user(uid uint32) string {
	return n.lookup(&n.users, uid, func(id string) (string, error) {
		u, err := user.LookupId(id)
		if err != nil {
			return "", err
		}
		return u.Username, nil
	})
}

func (n *names) group(gid uint32) string {
	return n.lookup(&n.groups, gid, func(id string) (string, error) {
		g, err := user.LookupGroupId(id)
		if err != nil {
			return "", err
		}
		return g.Name, nil
	})
}

func (n *names) lookup(cache *map[uint32]string, id uint32, find func(string) (string, error)) string {
	n.mu.Lock()
	defer n.mu.Unlock()
	if name, ok := (*cache)[id]; ok {
		return name
	}
	s := strconv.FormatUint(uint64(id), 10)
	name, err := find(s)
	if err != nil {
		name = s
	}
	if *cache == nil {
		*cache = map[uint32]string{}
	}
	(*cache)[id] = name
	return name
}

// entry describes the file at path (absolute, as resolved). A symbolic
// link is described by what it leads to, with its target; one that leads
// nowhere is a file of unknown type.
func (s *Server) entry(path string) (*fspb.EntryInfo, error) {
	stat := os.Lstat
	if path == s.paths.home {
		// The home is a link to /data only underneath: it is a folder.
		stat = os.Stat
	}
	fi, err := stat(path)
	if err != nil {
		return nil, fsError(err)
	}
	return s.entryOf(path, fi), nil
}

// entryOf describes the file at path whose Lstat is fi.
func (s *Server) entryOf(path string, fi fs.FileInfo) *fspb.EntryInfo {
	e := &fspb.EntryInfo{Name: filepath.Base(path), Path: s.paths.show(path)}
	if fi.Mode()&fs.ModeSymlink != 0 {
		if target, err := filepath.EvalSymlinks(path); err == nil {
			shown := s.paths.show(target)
			e.SymlinkTarget = &shown
		}
		if followed, err := os.Stat(path); err == nil {
			fi = followed
		} else {
			e.Type = fspb.FileType_FILE_TYPE_UNSPECIFIED
			return e
		}
	}
	switch {
	case fi.IsDir():
		e.Type = fspb.FileType_FILE_TYPE_DIRECTORY
	default:
		e.Type = fspb.FileType_FILE_TYPE_FILE
	}
	e.Size = fi.Size()
	e.Mode = uint32(fi.Mode().Perm())
	e.Permissions = fi.Mode().String()
	e.ModifiedTime = timestamppb.New(fi.ModTime())
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		e.Owner, e.Group = s.names.user(st.Uid), s.names.group(st.Gid)
	}
	e.Metadata = readMetadata(path)
	return e
}

// readMetadata returns a file's user.e2b.* attributes, the prefix taken
// off; nil for none (or a file system without them).
func readMetadata(path string) map[string]string {
	buf := make([]byte, 4096)
	n, err := unix.Listxattr(path, buf)
	if err != nil || n == 0 {
		return nil
	}
	var md map[string]string
	for name := range strings.SplitSeq(string(buf[:n]), "\x00") {
		key, ok := strings.CutPrefix(name, metadataPrefix)
		if !ok || key == "" {
			continue
		}
		val := make([]byte, maxMetadataBytes)
		m, err := unix.Getxattr(path, name, val)
		if err != nil {
			continue
		}
		if md == nil {
			md = map[string]string{}
		}
		md[key] = string(val[:m])
	}
	return md
}

// writeMetadata makes md (keys checked, lower case) a file's metadata:
// its other user.e2b.* attributes go.
func writeMetadata(f *os.File, md map[string]string) error {
	fd := int(f.Fd())
	buf := make([]byte, 4096)
	if n, err := unix.Flistxattr(fd, buf); err == nil {
		for name := range strings.SplitSeq(string(buf[:n]), "\x00") {
			if key, ok := strings.CutPrefix(name, metadataPrefix); ok && key != "" {
				if _, keep := md[key]; !keep {
					if err := unix.Fremovexattr(fd, name); err != nil && !errors.Is(err, unix.ENODATA) {
						return err
					}
				}
			}
		}
	}
	for k, v := range md {
		if err := unix.Fsetxattr(fd, metadataPrefix+k, []byte(v), 0); err != nil {
			return err
		}
	}
	return nil
}

// fsError is a file system error as the client is told it.
func fsError(err error) error {
	var code connect.Code
	switch {
	case errors.Is(err, fs.ErrNotExist):
		code = connect.CodeNotFound
	case errors.Is(err, fs.ErrExist):
		code = connect.CodeAlreadyExists
	case errors.Is(err, fs.ErrPermission):
		code = connect.CodePermissionDenied
	case errors.Is(err, syscall.ENOTDIR), errors.Is(err, syscall.EISDIR), errors.Is(err, syscall.ENAMETOOLONG),
		errors.Is(err, syscall.ELOOP), errors.Is(err, syscall.EINVAL):
		code = connect.CodeInvalidArgument
	case errors.Is(err, syscall.ENOSPC), errors.Is(err, syscall.EDQUOT):
		code = connect.CodeResourceExhausted
	default:
		code = connect.CodeInternal
	}
	return connect.NewError(code, err)
}
