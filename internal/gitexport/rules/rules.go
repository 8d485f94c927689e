// Package rules holds the security gateway's rules for what a client may
// name in a repository: branch names and file paths. They are checked at
// the edge, before anything reaches a forge, by internal/config (for the
// branches an operator writes) and internal/gitexport (for what clients
// send). Only the standard library: both sides import it.
package rules

import (
	"errors"
	"path"
	"regexp"
	"strings"
)

// MaxBranch and MaxPath bound the names clients send.
const (
	MaxBranch = 255
	MaxPath   = 1024
)

// The gateway's characters: ^[a-zA-Z0-9._/-]+$ for branches and paths.
var gatewayChars = regexp.MustCompile(`^[a-zA-Z0-9._/-]+$`)

// ErrBranch is why a branch name is refused.
var ErrBranch = errors.New(`a branch name is letters, digits, '.', '_', '/' and '-', without "..", "//", a leading '/', '-' or '.', a trailing '/' or '.', or a part ending in ".lock"`)

// Branch checks a branch name: the gateway's pattern (^[a-zA-Z0-9._/-]+$,
// no ".." or "//") and what git itself refuses in a ref (check-ref-format),
// so that no name reaches a forge that git would read another way.
func Branch(b string) error {
	if b == "" || len(b) > MaxBranch || !gatewayChars.MatchString(b) || strings.Contains(b, "..") ||
		strings.Contains(b, "//") || strings.HasPrefix(b, "/") || strings.HasSuffix(b, "/") ||
		strings.HasPrefix(b, "-") || strings.HasSuffix(b, ".") || b == "HEAD" {
		return ErrBranch
	}
	for seg := range strings.SplitSeq(b, "/") {
		if strings.HasPrefix(seg, ".") || strings.HasSuffix(seg, ".lock") {
			return ErrBranch
		}
	}
	return nil
}

// MatchBranch reports whether branch matches one of the globs (path.Match:
// '*' stays within one '/'-separated part).
func MatchBranch(globs []string, branch string) bool {
	for _, g := range globs {
		if ok, err := path.Match(g, branch); err == nil && ok {
			return true
		}
	}
	return false
}

// ValidGlob reports whether g is a pattern MatchBranch can use.
func ValidGlob(g string) bool {
	if g == "" || len(g) > MaxBranch || strings.ContainsAny(g, " \t\r\n\\") {
		return false
	}
	_, err := path.Match(g, "")
	return err == nil
}

// PathError says which rule a path breaks. Its text names the rule, never
// the path, so that it can go to a client as it is.
type PathError struct{ Rule string }

func (e *PathError) Error() string { return "the path " + e.Rule }

// Path checks a file path in a repository: the gateway's characters, not
// absolute, no empty part nor one of dots only ("." and "..", and "..."
// which Windows reads as "."), and no part that the built-in list
// (forbidden.go) or the repository's extra patterns forbid — a
// *ForbiddenError. /etc and /root are absolute, hence refused with every
// other absolute path.
func Path(p string, extra ...Pattern) error {
	switch {
	case p == "":
		return &PathError{"is empty"}
	case len(p) > MaxPath:
		return &PathError{"is too long"}
	case strings.HasPrefix(p, "/"):
		return &PathError{"must be relative to the repository's root, not absolute"}
	case !gatewayChars.MatchString(p):
		return &PathError{"may hold only letters, digits, '.', '_', '/' and '-'"}
	}
	for seg := range strings.SplitSeq(p, "/") {
		switch {
		case seg == "..":
			return &PathError{`must not climb out of the repository ("..")`}
		case strings.Trim(seg, ".") == "":
			return &PathError{`must not hold empty parts or parts made of dots only`}
		}
	}
	return forbidden(p, extra)
}
