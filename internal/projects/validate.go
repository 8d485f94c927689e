package projects

import (
	"fmt"
	"path"
	"regexp"
	"slices"
	"strings"

	"github.com/google/uuid"

	"github.com/runbox-dev/runbox"
	"github.com/runbox-dev/runbox/internal/gitexport/rules"
	"github.com/runbox-dev/runbox/internal/mcp"
)

// The security gateway's limits, exactly.
const (
	MaxProjectName      = 50
	MaxInitialFiles     = 20
	MaxInitialFileBytes = 1 << 20 // 1 MB
	MaxWriteFiles       = 10
	MaxWriteFileBytes   = 500 << 10 // 500 KB
	MaxOutputBytes      = 50 << 10  // 50 KB
	maxPathBytes        = 1024
)

var projectNamePattern = regexp.MustCompile(`^[a-zA-Z0-9_-]+$`)

func checkProjectName(name string) error {
	if len(name) < 1 || len(name) > MaxProjectName || !projectNamePattern.MatchString(name) {
		return runbox.Errorf(runbox.EInvalid, "project_name must be 1 to %d letters, digits, '_' or '-'", MaxProjectName)
	}
	return nil
}

// checkSandboxID reads a sandbox_id: a UUID, as create_sandbox_for_project
// makes them. Anything else names no sandbox.
func checkSandboxID(id string) (string, error) {
	u, err := uuid.Parse(id)
	if err != nil || len(id) != 36 {
		return "", notFound(id)
	}
	return u.String(), nil
}

func notFound(id string) error {
	if len(id) > 64 {
		id = id[:64] + "…"
	}
	return runbox.Errorf(runbox.ESandboxNotFound, "no sandbox %q: it was never made, belongs to another client, or has expired", id)
}

// checkPath reads a file's path as the gateway allows it: relative, no
// "..", none of the forbidden names. It returns the path clean ("./a" is
// "a").
func checkPath(p string) (string, error) {
	bad := func(why string) (string, error) {
		return "", runbox.Errorf(runbox.EPathTraversal, "path %q %s", shorten(p), why)
	}
	switch {
	case p == "" || len(p) > maxPathBytes:
		return bad(fmt.Sprintf("must have 1 to %d bytes", maxPathBytes))
	case strings.ContainsFunc(p, func(r rune) bool { return r < 0x20 || r == 0x7f }):
		return bad("holds a control character")
	case strings.HasPrefix(p, "/") || strings.HasPrefix(p, "~") || strings.Contains(p, "\\") ||
		len(p) > 1 && p[1] == ':':
		return bad("is not relative to the project")
	}
	parts := strings.Split(p, "/")
	if slices.Contains(parts, "..") {
		return bad("leaves the project (..)")
	}
	clean := path.Clean(p)
	if clean == "." || strings.HasPrefix(clean, "../") {
		return bad("names no file")
	}
	// The gateway's four names (secrets, version control, dependencies,
	// the editor's settings), as the git tools refuse them; the CI files
	// those refuse besides are harmless in a sandbox, and are refused
	// when committed.
	for _, part := range strings.Split(clean, "/") {
		if glob, ok := rules.GatewayName(part); ok {
			return "", runbox.Errorf(runbox.EPermissionDenied, "path %q: %s files may not be written", shorten(p), glob)
		}
	}
	return clean, nil
}

func shorten(s string) string {
	if len(s) > 80 {
		return s[:80] + "…"
	}
	return s
}

// File is a file of a project, checked.
type File struct {
	Path string
	Data []byte
}

// checkFiles checks a tool's files (either shape) against its limits and
// the path rules, and returns them sorted by path.
func checkFiles(files mcp.Files, maxFiles, maxBytes int) ([]File, error) {
	if len(files) > maxFiles {
		return nil, runbox.Errorf(runbox.EGatewayQuota, "%d files given; at most %d per call", len(files), maxFiles)
	}
	out := make([]File, 0, len(files))
	seen := map[string]bool{}
	for _, f := range files {
		clean, err := checkPath(f.Path)
		if err != nil {
			return nil, err
		}
		data, err := f.Data(maxBytes)
		if err != nil {
			return nil, err
		}
		if seen[clean] {
			return nil, runbox.Errorf(runbox.EInvalid, "%s is given twice", shorten(clean))
		}
		seen[clean] = true
		out = append(out, File{Path: clean, Data: data})
	}
	slices.SortFunc(out, func(a, b File) int { return strings.Compare(a.Path, b.Path) })
	return out, nil
}
