package envd

import (
	"path/filepath"
	"strings"

	"connectrpc.com/connect"
)

// maxPath bounds a path a client names (Linux's PATH_MAX).
const maxPath = 4096

// paths is how envd names files. Clients name them as in E2B's sandboxes:
// absolute, or relative to the user's home, /home/user. In a runbox
// sandbox that home is the conversation's folder, /data, under another
// name (a symbolic link in the image), so a real path under /data is
// shown under the home: a client never sees the difference.
//
// A path is resolved by the kernel inside the sandbox, as the sandbox's
// user: ".." and symbolic links lead only within the sandbox's own
// filesystem, which is all envd can reach. Nothing here is a boundary;
// the sandbox is.
type paths struct {
	home string // as clients name it: /home/user
	data string // what it leads to: /data
}

// resolve returns the absolute, clean path a client's name stands for.
func (p paths) resolve(name string) (string, error) {
	switch {
	case strings.IndexByte(name, 0) >= 0:
		return "", connect.NewError(connect.CodeInvalidArgument, errPathNUL)
	case len(name) > maxPath:
		return "", connect.NewError(connect.CodeInvalidArgument, errPathLong)
	case name == "":
		return p.home, nil
	case !filepath.IsAbs(name):
		name = filepath.Join(p.home, name)
	}
	return filepath.Clean(name), nil
}

// show names a real path as clients know it: under the home rather than
// under /data.
func (p paths) show(real string) string {
	if real == p.data {
		return p.home
	}
	if rest, ok := strings.CutPrefix(real, p.data+"/"); ok {
		return p.home + "/" + rest
	}
	return real
}
