package mcp

import (
	"context"
	"encoding/json"
	"fmt"
	"reflect"
	"sync"

	"github.com/google/jsonschema-go/jsonschema"
	mcpsdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/runbox-dev/runbox"
)

// ToolSpec is how a tool behaves, beyond what its types say: its
// annotations, the dialect of its errors and the other names it answers
// to.
type ToolSpec struct {
	ReadOnly, Destructive, Idempotent bool
	// OpenWorld says the tool reaches outside the service (a git forge).
	OpenWorld bool
	// Egress says the tool's programs may ask to reach outside the
	// service: it is open-world where the operator lets clients ask
	// (SANDBOX_EGRESS_ALLOW, a tier's egress_domains).
	Egress bool
	// Dialect words the tool's errors, those of the middleware included
	// (rate_limited …); the zero Dialect is runbox's own.
	Dialect Dialect
	// Aliases are names some clients call the tool by: answered as the
	// tool, but not listed.
	Aliases []string
}

// AddTool adds a tool to s; every tool is added this way. h is the tool:
// the arguments in, decoded into In after the SDK checked them against
// In's schema; its answer out, whose output schema is Out's (Answer and
// OneOf shape it further), or an error: a *runbox.Error is a tool error
// with its code and message in spec's dialect, anything else "internal"
// and logged. Every output schema admits the tool error besides the
// answer, so that a client that checks results against it accepts both.
// A tool added twice panics, as does an answer type with no schema (an
// interface).
func AddTool[In, Out any](s *Server, t *mcpsdk.Tool, spec ToolSpec, h func(context.Context, In) (Out, error)) {
	inSchema, outSchema := inputSchemaOf[In](), outputSchemaOf[Out]()
	s.tools.add(t.Name, spec)
	t.InputSchema = inSchema
	t.OutputSchema = &jsonschema.Schema{Type: "object", AnyOf: []*jsonschema.Schema{outSchema, toolErrorSchema}}
	t.Annotations = s.annotations(spec)
	mcpsdk.AddTool(s.sdk, t, func(ctx context.Context, req *mcpsdk.CallToolRequest, in In) (*mcpsdk.CallToolResult, any, error) {
		out, err := h(context.WithValue(ctx, callKey{}, toolCall{s, req}), in)
		if err != nil {
			return s.toolError(ctx, spec.Dialect, err)
		}
		return reply(out)
	})
}

// annotations are what spec says of a tool, for clients. Only tools that
// say so reach outside the service (the git tools), and those whose
// programs may ask for network where the operator lets clients ask.
func (s *Server) annotations(spec ToolSpec) *mcpsdk.ToolAnnotations {
	destructive := spec.Destructive
	open := spec.OpenWorld || (spec.Egress && s.runs.Limits().EgressReachable)
	return &mcpsdk.ToolAnnotations{
		ReadOnlyHint:    spec.ReadOnly,
		DestructiveHint: &destructive,
		IdempotentHint:  spec.Idempotent,
		OpenWorldHint:   &open,
	}
}

// Answer is a tool's answer with the content clients show besides its
// structured form: images to look at, links to its files, text. Its
// output schema is T's. Without Content, the content is the answer's
// JSON as text.
type Answer[T any] struct {
	Value   T
	Content []mcpsdk.Content
}

func (a Answer[T]) parts() (any, []mcpsdk.Content) { return a.Value, a.Content }
func (Answer[T]) outputSchema() *jsonschema.Schema { return outputSchemaOf[T]() }

// OneOf is an answer of one of two types, First or Second; its output
// schema admits either.
type OneOf[A, B any] struct {
	First  *A
	Second *B
}

// MarshalJSON is the answer given.
func (o OneOf[A, B]) MarshalJSON() ([]byte, error) {
	if o.First != nil {
		return json.Marshal(o.First)
	}
	return json.Marshal(o.Second)
}

func (OneOf[A, B]) outputSchema() *jsonschema.Schema {
	return &jsonschema.Schema{AnyOf: []*jsonschema.Schema{outputSchemaOf[A](), outputSchemaOf[B]()}}
}

// reply is the result of a tool that answered out.
func reply[Out any](out Out) (*mcpsdk.CallToolResult, any, error) {
	a, ok := any(out).(interface {
		parts() (any, []mcpsdk.Content)
	})
	if !ok {
		return nil, out, nil
	}
	v, content := a.parts()
	if content == nil {
		return nil, v, nil
	}
	return &mcpsdk.CallToolResult{Content: content}, v, nil
}

// outputSchemaOf is the schema of an answer of type T: its own (Answer,
// OneOf), or the one its fields give.
func outputSchemaOf[T any]() *jsonschema.Schema {
	if own, ok := any(*new(T)).(interface{ outputSchema() *jsonschema.Schema }); ok {
		return own.outputSchema()
	}
	if reflect.TypeFor[T]().Kind() == reflect.Interface {
		panic(fmt.Sprintf("mcp: an answer of type %v has no schema", reflect.TypeFor[T]()))
	}
	s, err := jsonschema.For[T](nil)
	if err != nil {
		panic(fmt.Sprintf("output schema of %v: %v", reflect.TypeFor[T](), err))
	}
	return s
}

// Tool errors come in runbox's shape, or the PRD's for its tools.
var toolErrorSchema = &jsonschema.Schema{AnyOf: []*jsonschema.Schema{outputSchemaOf[ToolError](), outputSchemaOf[PRDError]()}}

// registry is what AddTool was told of each tool, for the middleware,
// which knows a call by its tool's name only: the dialect its refusals
// speak, the aliases it rewrites. Tools may be added while calls are
// served.
type registry struct {
	mu       sync.RWMutex
	dialects map[string]Dialect
	aliases  map[string]string // tool by alias
}

func (r *registry) add(name string, spec ToolSpec) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.dialects == nil {
		r.dialects, r.aliases = map[string]Dialect{}, map[string]string{}
	}
	for _, n := range append([]string{name}, spec.Aliases...) {
		if _, dup := r.dialects[n]; dup || r.aliases[n] != "" {
			panic("mcp: tool " + n + " is added twice")
		}
	}
	r.dialects[name] = spec.Dialect
	for _, a := range spec.Aliases {
		r.aliases[a] = name
	}
}

// dialect is the dialect of tool name; runbox's for a tool there is not.
func (r *registry) dialect(name string) Dialect {
	r.mu.RLock()
	defer r.mu.RUnlock()
	return r.dialects[name]
}

// tool is the tool an alias names, if name is one.
func (r *registry) tool(alias string) (string, bool) {
	r.mu.RLock()
	defer r.mu.RUnlock()
	name, ok := r.aliases[alias]
	return name, ok
}

type callKey struct{}

// toolCall is a tool call under way, for Progress.
type toolCall struct {
	s   *Server
	req *mcpsdk.CallToolRequest
}

// Progress returns, for a tool call that carries a progress token, a
// handler that streams a run's output to the caller as progress
// notifications (and a heartbeat while it is silent), and the func that
// ends them; nil and a no-op otherwise.
func Progress(ctx context.Context) (func(runbox.Event), func()) {
	c, ok := ctx.Value(callKey{}).(toolCall)
	if !ok {
		return nil, func() {}
	}
	return c.s.startProgress(ctx, c.req)
}
