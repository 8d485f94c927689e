package api

import (
	"bytes"
	_ "embed"
	"fmt"
	"html/template"
	"maps"
	"net/http"
	"slices"
	"strings"

	"github.com/labstack/echo/v4"
	"github.com/swaggest/openapi-go/openapi31"
)

// The reference page is the OpenAPI document rendered as plain HTML by
// html/template when the server starts: no script, nothing from a CDN.

//go:embed reference.html
var referenceHTML string

var referencePage = template.Must(template.New("reference").Parse(referenceHTML))

// referenceCSP lets the page use its own inline style and nothing else.
const referenceCSP = "default-src 'none'; style-src 'unsafe-inline'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

func (s *Server) reference(c echo.Context) error {
	c.Response().Header().Set("Content-Security-Policy", referenceCSP)
	return c.HTMLBlob(http.StatusOK, s.doc.page)
}

// A refPage is what the page shows of the document.
type refPage struct {
	Title, Version, Description string
	Schemes                     []refScheme
	Tags                        []refTag
	Schemas                     []refSchema
}

type refScheme struct{ Name, Description string }

type refTag struct {
	Name, Description string
	Ops               []refOp
}

type refOp struct {
	Method, Path, ID, Summary string
	Auth                      string
	Params                    []refField
	Body                      []refContent
	Responses                 []refResponse
}

// refField is a parameter or a property.
type refField struct {
	Name, In, Description string
	Type                  []refSeg
	Required              bool
}

type refContent struct {
	MediaType string
	Type      []refSeg
}

type refResponse struct {
	Status, Description string
	Contents            []refContent
	Headers             []string
}

type refSchema struct {
	Name, Description string
	Type              []refSeg // for a schema that is not an object of properties
	Props             []refField
}

// refSeg is a piece of a type's name: text, or a link to a schema.
type refSeg struct{ Text, Ref string }

// renderReference renders the page of spec.
func renderReference(spec *openapi31.Spec) ([]byte, error) {
	p := refPage{Title: spec.Info.Title, Version: spec.Info.Version, Description: deref(spec.Info.Description)}
	if spec.Components != nil {
		for _, name := range sortedKeys(spec.Components.SecuritySchemes) {
			ss := spec.Components.SecuritySchemes[name].SecurityScheme
			p.Schemes = append(p.Schemes, refScheme{Name: name, Description: deref(ss.Description)})
		}
		for _, name := range sortedKeys(spec.Components.Schemas) {
			p.Schemas = append(p.Schemas, refSchemaOf(name, spec.Components.Schemas[name]))
		}
	}
	for _, t := range spec.Tags {
		p.Tags = append(p.Tags, refTag{Name: t.Name, Description: deref(t.Description)})
	}
	for _, path := range sortedKeys(spec.Paths.MapOfPathItemValues) {
		item := spec.Paths.MapOfPathItemValues[path]
		for _, method := range methods {
			op := operation(item, method)
			if op == nil {
				continue
			}
			i := slices.IndexFunc(p.Tags, func(t refTag) bool { return slices.Contains(op.Tags, t.Name) })
			if i < 0 {
				return nil, fmt.Errorf("%s %s has no tag of the document", method, path)
			}
			p.Tags[i].Ops = append(p.Tags[i].Ops, refOpOf(method, path, op))
		}
	}
	var b bytes.Buffer
	if err := referencePage.Execute(&b, p); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}

// methods are the methods OpenAPI knows, in the order the page shows them.
var methods = []string{"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "TRACE"}

// operation is a path's operation of a method, or nil.
func operation(item openapi31.PathItem, method string) *openapi31.Operation {
	return map[string]*openapi31.Operation{"GET": item.Get, "HEAD": item.Head, "POST": item.Post, "PUT": item.Put,
		"PATCH": item.Patch, "DELETE": item.Delete, "OPTIONS": item.Options, "TRACE": item.Trace}[method]
}

func refOpOf(method, path string, op *openapi31.Operation) refOp {
	o := refOp{Method: method, Path: path, ID: deref(op.ID), Summary: deref(op.Summary), Auth: "none"}
	var auth []string
	for _, req := range op.Security {
		if len(req) == 0 {
			auth = append(auth, "none")
		}
		auth = append(auth, sortedKeys(req)...)
	}
	if len(auth) > 0 {
		o.Auth = strings.Join(auth, " or ")
	}
	for _, pr := range op.Parameters {
		if p := pr.Parameter; p != nil {
			o.Params = append(o.Params, refField{Name: p.Name, In: string(p.In), Description: deref(p.Description),
				Type: typeOf(p.Schema), Required: p.Required != nil && *p.Required})
		}
	}
	if op.RequestBody != nil && op.RequestBody.RequestBody != nil {
		o.Body = contentsOf(op.RequestBody.RequestBody.Content)
	}
	for _, code := range sortedKeys(op.Responses.MapOfResponseOrReferenceValues) {
		r := op.Responses.MapOfResponseOrReferenceValues[code].Response
		resp := refResponse{Status: code, Description: r.Description, Contents: contentsOf(r.Content)}
		resp.Headers = sortedKeys(r.Headers)
		o.Responses = append(o.Responses, resp)
	}
	return o
}

func contentsOf(content map[string]openapi31.MediaType) []refContent {
	var out []refContent
	for _, mt := range sortedKeys(content) {
		out = append(out, refContent{MediaType: mt, Type: typeOf(content[mt].Schema)})
	}
	return out
}

func refSchemaOf(name string, s map[string]any) refSchema {
	rs := refSchema{Name: name, Description: str(s["description"])}
	props, _ := s["properties"].(map[string]any)
	if len(props) == 0 {
		rs.Type = typeOf(s)
		return rs
	}
	required, _ := s["required"].([]any)
	for _, p := range sortedKeys(props) {
		ps, _ := props[p].(map[string]any)
		rs.Props = append(rs.Props, refField{Name: p, Description: str(ps["description"]), Type: typeOf(ps),
			Required: slices.Contains(required, any(p))})
	}
	return rs
}

// typeOf names a schema's type for a person: "array of FileInfo or null".
func typeOf(s map[string]any) []refSeg {
	if ref, ok := s["$ref"].(string); ok {
		name := strings.TrimPrefix(ref, "#/components/schemas/")
		return []refSeg{{Text: name, Ref: name}}
	}
	if alts, ok := s["oneOf"].([]any); ok {
		segs := []refSeg{{Text: "one of "}}
		for i, a := range alts {
			if i > 0 {
				segs = append(segs, refSeg{Text: " | "})
			}
			am, _ := a.(map[string]any)
			segs = append(segs, typeOf(am)...)
		}
		return segs
	}
	var types []string
	switch t := s["type"].(type) {
	case string:
		types = []string{t}
	case []any:
		for _, v := range t {
			types = append(types, str(v))
		}
	}
	nullable := slices.Contains(types, "null")
	types = slices.DeleteFunc(types, func(t string) bool { return t == "null" })
	var segs []refSeg
	switch {
	case len(types) == 0:
		segs = []refSeg{{Text: "any"}}
	case types[0] == "array":
		items, _ := s["items"].(map[string]any)
		segs = append([]refSeg{{Text: "array of "}}, typeOf(items)...)
	case types[0] == "object" && s["additionalProperties"] != nil:
		values, _ := s["additionalProperties"].(map[string]any)
		segs = append([]refSeg{{Text: "map of "}}, typeOf(values)...)
	default:
		segs = []refSeg{{Text: strings.Join(types, " or ")}}
	}
	for _, k := range []string{"format", "pattern", "minimum", "maximum"} {
		if v, ok := s[k]; ok {
			segs = append(segs, refSeg{Text: fmt.Sprintf(", %s %v", k, v)})
		}
	}
	if nullable {
		segs = append(segs, refSeg{Text: " or null"})
	}
	return segs
}

func sortedKeys[V any](m map[string]V) []string { return slices.Sorted(maps.Keys(m)) }

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}

func str(v any) string {
	s, _ := v.(string)
	return s
}
