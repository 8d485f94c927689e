package audit

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"slices"
	"unicode/utf8"
)

// What the log keeps of a call's arguments follows one rule: an argument
// is kept as its length and SHA-256 ({len, sha256}) unless its name is
// in fields, which lists the arguments that name something (an id, a
// name, a path, a domain) or choose among options. Numbers and booleans
// are kept whatever their name: they hold no text. So whatever a tool
// takes that carries text — code, a command, input for a program, a
// commit message, an environment variable's value, a file's content — is
// in the log as a digest only, and so is every argument a tool gains
// later until it is listed here: a new tool cannot put a secret in the
// log by default. A digest still shows whoever holds the text that it is
// what was sent. A token is never an argument: tokens travel in headers,
// which are not recorded.

// kind is how an argument named in fields is kept.
type kind int

const (
	// digested: {len, sha256}, the rule for every argument not listed.
	digested kind = iota
	// name: text that names or chooses, kept (cut to 256 bytes); a list
	// of them as {count, <argument>: [the first 32]}.
	name
	// object: an object whose own fields follow the same rule.
	object
	// keyed: an object of names and values (environment variables): the
	// names kept, each value digested.
	keyed
	// fileSet: files to be written, a list of {path, content, encoding}
	// or an object path → content: {count, files: [the first 32]}, each
	// with its path and encoding, its content (and anything else)
	// digested.
	fileSet
)

// fields are the arguments kept as more than a digest, at any depth.
var fields = map[string]kind{
	// Ids, names and choices of the tools.
	"conversationId": name, "new_conversation_id": name, "session_id": name, "sandbox_id": name, "run_id": name, "execution_id": name,
	"idempotency_key": name, "language": name, "template": name, "project_name": name, "output_type": name,
	"repo_id": name, "branch": name, "filename": name, "name": name, "path": name, "file_path": name,
	"paths": name, "target_dir": name, "working_directory": name, "encoding": name,
	// What a run may reach and touch.
	"network": object, "sandbox_config": object, "filesystem": object,
	"allowed_domains": name, "denied_domains": name, "allow_write": name, "deny_read": name, "deny_write": name,
	// The secrets a run asks for: their names (the values never come in).
	"secrets": name,
	// Query parameters of REST requests (text, whatever they hold).
	"wait": name, "after": name, "overwrite": name,
	// Environment variables: their names.
	"env": keyed, "environment": keyed,
	// Files to write: their paths.
	"files": fileSet, "initial_files": fileSet,
}

// Bounds of what is kept: the text of a name, the items of a list, the
// depth of objects within objects.
const (
	maxParamString = 256
	maxParamItems  = 32
	maxParamDepth  = 3
)

// Sanitize returns a call's arguments as the log keeps them (see fields).
func Sanitize(args map[string]any) map[string]any {
	if len(args) == 0 {
		return nil
	}
	return sanitizeObject(args, 0)
}

func sanitizeObject(m map[string]any, depth int) map[string]any {
	out := make(map[string]any, len(m))
	for k, v := range m {
		out[cut(k)] = sanitize(k, v, depth)
	}
	return out
}

func sanitize(k string, v any, depth int) any {
	switch v.(type) {
	case float64, bool, nil, json.Number:
		return v
	}
	switch fields[k] {
	case name:
		return nameValue(k, v)
	case object:
		if m, ok := v.(map[string]any); ok && depth < maxParamDepth {
			return sanitizeObject(m, depth+1)
		}
	case keyed:
		if m, ok := v.(map[string]any); ok && len(m) <= maxParamItems {
			out := make(map[string]any, len(m))
			for name, val := range m {
				out[cut(name)] = digest(val)
			}
			return out
		}
	case fileSet:
		return fileList(v, depth)
	}
	return digest(v)
}

// nameValue keeps a name, or a list of names; anything else in their
// place is digested.
func nameValue(k string, v any) any {
	switch val := v.(type) {
	case string:
		return cut(val)
	case []any:
		out := make([]any, 0, min(len(val), maxParamItems))
		for _, item := range val[:min(len(val), maxParamItems)] {
			if s, ok := item.(string); ok {
				out = append(out, cut(s))
			} else {
				out = append(out, digest(item))
			}
		}
		return map[string]any{"count": len(val), k: out}
	}
	return digest(v)
}

// fileList records files to be written: each path and encoding, and its
// content (and any other field) as a digest.
func fileList(v any, depth int) any {
	var out []map[string]any
	switch files := v.(type) {
	case []any:
		for _, f := range files[:min(len(files), maxParamItems)] {
			m, ok := f.(map[string]any)
			if !ok {
				m = map[string]any{"content": f}
			}
			out = append(out, sanitizeObject(m, depth+1))
		}
		return map[string]any{"count": len(files), "files": out}
	case map[string]any:
		paths := make([]string, 0, len(files))
		for p := range files {
			paths = append(paths, p)
		}
		slices.Sort(paths)
		for _, p := range paths[:min(len(paths), maxParamItems)] {
			out = append(out, map[string]any{"path": cut(p), "content": digest(files[p])})
		}
		return map[string]any{"count": len(files), "files": out}
	}
	return digest(v)
}

func digest(v any) map[string]any {
	s, ok := v.(string)
	if !ok {
		b, _ := json.Marshal(v)
		s = string(b)
	}
	sum := sha256.Sum256([]byte(s))
	return map[string]any{"len": len(s), "sha256": hex.EncodeToString(sum[:])}
}

func cut(s string) string {
	if len(s) <= maxParamString {
		return s
	}
	s = s[:maxParamString]
	for !utf8.ValidString(s) {
		s = s[:len(s)-1]
	}
	return fmt.Sprintf("%s…", s)
}
