package projects

import (
	"fmt"
	"path"
	"regexp"
	"slices"
	"strings"

	"github.com/google/uuid"

	"github.com/runbox-dev/runbox"
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

// Names no path may hold as one of its parts (by prefix, in any case):
// secrets, version control, dependencies and the editor's settings.
var forbidden = []string{".env", ".git", "node_modules", ".codesandbox"}

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
	for _, part := range strings.Split(clean, "/") {
		lower := strings.ToLower(part)
		for _, f := range forbidden {
			if strings.HasPrefix(lower, f) {
				return "", runbox.Errorf(runbox.EPermissionDenied, "path %q: %s* files may not be written", shorten(p), f)
			}
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

// checkFiles checks a tool's files against its limits and the path rules,
// and returns them sorted by path.
func checkFiles(files map[string]string, maxFiles, maxBytes int) ([]File, error) {
	if len(files) > maxFiles {
		return nil, runbox.Errorf(runbox.EGatewayQuota, "%d files given; at most %d per call", len(files), maxFiles)
	}
	out := make([]File, 0, len(files))
	seen := map[string]bool{}
	for p, content := range files {
		clean, err := checkPath(p)
		if err != nil {
			return nil, err
		}
		if len(content) > maxBytes {
			return nil, runbox.Errorf(runbox.EFileSizeExceeded, "%s has %d bytes; at most %d per file", shorten(p), len(content), maxBytes)
		}
		if seen[clean] {
			return nil, runbox.Errorf(runbox.EInvalid, "%s is given twice", shorten(clean))
		}
		seen[clean] = true
		out = append(out, File{Path: clean, Data: []byte(content)})
	}
	slices.SortFunc(out, func(a, b File) int { return strings.Compare(a.Path, b.Path) })
	return out, nil
}
