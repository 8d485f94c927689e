package mcp

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"maps"
	"reflect"
	"slices"
	"strings"

	"github.com/google/jsonschema-go/jsonschema"

	"github.com/runbox-dev/runbox"
)

// FileArg is a file a tool's arguments carry: where it goes, and its
// content as text or, with encoding base64, as the base64 of its bytes.
type FileArg struct {
	Path     string `json:"path" jsonschema:"where the file goes, relative"`
	Content  string `json:"content" jsonschema:"the file's content: text, or base64 with encoding base64"`
	Encoding string `json:"encoding,omitempty" jsonschema:"utf-8 (the default) or base64 (for binary files)"`
}

// Files are the files a tool's arguments carry, in either shape clients
// send them: runbox's list [{path, content, encoding?}], or the security
// gateway's record {path: content} (text). The project tools and the git
// tools take both, through this one decoder. A record's entries come in
// the order of their paths: the SDK reads arguments into a map before
// they reach a tool, which keeps neither the order written nor a key
// given twice (the last one wins, as in any JSON object).
type Files []FileArg

// UnmarshalJSON reads either shape.
func (f *Files) UnmarshalJSON(b []byte) error {
	b = bytes.TrimSpace(b)
	switch {
	case bytes.Equal(b, []byte("null")):
		*f = nil
		return nil
	case len(b) > 0 && b[0] == '[':
		var list []FileArg
		if err := json.Unmarshal(b, &list); err != nil {
			return err
		}
		*f = list
		return nil
	}
	var record map[string]string
	if err := json.Unmarshal(b, &record); err != nil {
		return fmt.Errorf("files must be a list of {path, content, encoding?} or a record {path: content}: %w", err)
	}
	out := make(Files, 0, len(record))
	for _, p := range slices.Sorted(maps.Keys(record)) {
		out = append(out, FileArg{Path: p, Content: record[p]})
	}
	*f = out
	return nil
}

// filesSchema admits both shapes: tools that take Files describe them so
// (AddTool), and the SDK checks arguments against it before they are
// decoded.
var filesSchema = func() *jsonschema.Schema {
	item, err := jsonschema.For[FileArg](nil)
	if err != nil {
		panic(err)
	}
	return &jsonschema.Schema{AnyOf: []*jsonschema.Schema{
		{Type: "array", Items: item, Description: "a list of {path, content, encoding?}"},
		{Type: "object", AdditionalProperties: &jsonschema.Schema{Type: "string"}, Description: "a record {path: content}, text"},
	}}
}()

// argSchemas are the schemas of argument types whose JSON is not what
// their Go type says.
var argSchemas = map[reflect.Type]*jsonschema.Schema{reflect.TypeFor[Files](): filesSchema}

// inputSchemaOf is the input schema of a tool that takes In.
func inputSchemaOf[In any]() *jsonschema.Schema {
	s, err := jsonschema.For[In](&jsonschema.ForOptions{TypeSchemas: argSchemas})
	if err != nil {
		panic(fmt.Sprintf("input schema of %T: %v", *new(In), err))
	}
	return s
}

// Data returns the file's bytes: its text, or its base64 decoded; a file
// over max bytes is FILE_SIZE_EXCEEDED (measured before decoding, so that
// an oversized one costs nothing).
func (f FileArg) Data(max int) ([]byte, error) {
	switch strings.ToLower(f.Encoding) {
	case "", "utf-8", "utf8", "text":
		if len(f.Content) > max {
			return nil, tooLarge(f.Path, len(f.Content), max)
		}
		return []byte(f.Content), nil
	case "base64":
		if len(f.Content) > base64.StdEncoding.EncodedLen(max)+4 {
			return nil, tooLarge(f.Path, base64.StdEncoding.DecodedLen(len(f.Content)), max)
		}
		data, err := base64.StdEncoding.DecodeString(f.Content)
		if err != nil {
			return nil, runbox.Errorf(runbox.EInvalid, "the content of %s is not valid base64", shortPath(f.Path))
		}
		if len(data) > max {
			return nil, tooLarge(f.Path, len(data), max)
		}
		return data, nil
	}
	return nil, runbox.Errorf(runbox.EInvalid, "encoding must be utf-8 or base64")
}

func tooLarge(path string, size, max int) error {
	return runbox.Errorf(runbox.EFileSizeExceeded, "%s is %d bytes; a file may be at most %d", shortPath(path), size, max)
}

func shortPath(p string) string {
	if len(p) > 80 {
		return p[:80] + "…"
	}
	return p
}
