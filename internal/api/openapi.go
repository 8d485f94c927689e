package api

import (
	"encoding/json"
	"fmt"
	"net/http"
	"reflect"
	"slices"
	"strings"

	"github.com/labstack/echo/v4"
	"github.com/swaggest/jsonschema-go"
	"github.com/swaggest/openapi-go"
	"github.com/swaggest/openapi-go/openapi31"

	"github.com/runbox-dev/runbox"
	"github.com/runbox-dev/runbox/internal/mcp"
)

// The OpenAPI 3.1 document is reflected from the route table's Go types
// by swaggest/openapi-go: it reads the types with their json tags (and
// path, query, header for parameters) as they are, so the handlers keep
// Echo and their types, and nothing is written twice. (huma would have
// replaced the router and the error answers; kin-openapi builds 3.0.)

// docs/openapi.yaml and the client generated from it (apiclient) are
// written by the tests that check them.
//go:generate go test -run ^(TestDocument|TestGeneratedClient)$ . -args -update

// document is the OpenAPI document of the REST API.
type document struct {
	spec *openapi31.Spec
	json []byte
	page []byte // the reference page
}

// openAPIDocument stands for the answer of /openapi.json: an OpenAPI 3.1
// document.
type openAPIDocument map[string]any

// Security schemes.
const (
	tokenScheme   = "token"
	metricsScheme = "metricsToken"
)

// mustDocument builds the document of routes. The routes are the
// program's own and TestDocument builds them, so a failure is a bug.
func mustDocument(routes []route) *document {
	d, err := newDocument(routes)
	if err != nil {
		panic(fmt.Sprintf("the OpenAPI document: %v", err))
	}
	return d
}

func newDocument(routes []route) (*document, error) {
	r := openapi31.NewReflector()
	r.DefaultOptions = append(r.DefaultOptions, jsonschema.InterceptProp(describe),
		jsonschema.InterceptDefName(func(_ reflect.Type, name string) string {
			return strings.TrimPrefix(strings.TrimPrefix(name, "Runbox"), "Api")
		}))
	spec := r.SpecEns()
	spec.Info.WithTitle("runbox").WithVersion(mcp.Version).WithDescription(
		"runbox's REST API: runs, their events and input; conversations' files and previews. " +
			"The MCP endpoints (/mcp, /mcp/events) and the queue dashboard (/monitoring) are not REST and not described here.")
	spec.SetHTTPBearerTokenSecurity(tokenScheme, "", "A client's API token: MCP_API_TOKEN, MCP_API_TOKENS or CLIENTS_FILE")
	spec.SetHTTPBearerTokenSecurity(metricsScheme, "", "METRICS_TOKEN, when the operator set one")
	spec.WithTags(
		openapi31.Tag{Name: tagRuns, Description: new("Programs: start, follow, feed and cancel them")},
		openapi31.Tag{Name: tagBatches, Description: new("Many runs at once: submit, follow, cancel")},
		openapi31.Tag{Name: tagConversations, Description: new("A conversation's files (its /data) and previews")},
		openapi31.Tag{Name: tagService, Description: new("Downloads by signed URL, health, metrics and these pages")})
	for _, rt := range routes {
		if err := addOperation(r, rt); err != nil {
			return nil, fmt.Errorf("%s %s: %w", rt.method, rt.path, err)
		}
	}
	// Run events travel inside the event stream, which no schema covers.
	event, err := r.Reflect(runbox.Event{}, jsonschema.RootRef, jsonschema.DefinitionsPrefix("#/components/schemas/"),
		jsonschema.CollectDefinitions(func(name string, s jsonschema.Schema) {
			sm, err := s.ToSchemaOrBool().ToSimpleMap()
			if err == nil {
				spec.ComponentsEns().WithSchemasItem(name, sm)
			}
		}))
	if err != nil || event.Ref == nil {
		return nil, fmt.Errorf("the Event schema: %v", err)
	}
	b, err := json.Marshal(spec)
	if err != nil {
		return nil, err
	}
	page, err := renderReference(spec)
	if err != nil {
		return nil, fmt.Errorf("the reference page: %w", err)
	}
	return &document{spec: spec, json: b, page: page}, nil
}

func addOperation(r *openapi31.Reflector, rt route) error {
	oc, err := r.NewOperationContext(rt.method, rt.docPath())
	if err != nil {
		return err
	}
	oc.SetID(rt.id)
	oc.SetTags(rt.tag)
	oc.SetSummary(rt.summary)
	op := oc.(openapi31.OperationExposer).Operation()
	switch rt.access {
	case bearer:
		oc.AddSecurity(tokenScheme)
	case metricsBearer:
		// The token is asked for only when METRICS_TOKEN is set.
		op.Security = []map[string][]string{{}, {metricsScheme: {}}}
	}
	if rt.params != nil {
		oc.AddReqStructure(rt.params)
	}
	required := openapi.WithCustomize(func(cor openapi.ContentOrReference) {
		if rb, ok := cor.(*openapi31.RequestBodyOrReference); ok && rb.RequestBody != nil {
			rb.RequestBody.WithRequired(true)
		}
	})
	switch b := rt.body.(type) {
	case nil:
	case raw:
		oc.AddReqStructure(nil, openapi.WithContentType(b.contentType), required)
	default:
		oc.AddReqStructure(b, openapi.WithContentType(echo.MIMEApplicationJSON), required)
	}
	addAnswers(oc, rt.answers)
	for _, code := range errorStatuses(rt) {
		oc.AddRespStructure(errorReply{}, openapi.WithHTTPStatus(code), withDescription(errorDescription(code)),
			openapi.WithCustomize(func(cor openapi.ContentOrReference) {
				if code == http.StatusTooManyRequests || code == http.StatusServiceUnavailable {
					retryAfter(cor.(*openapi31.ResponseOrReference).Response)
				}
			}))
	}
	return r.AddOperation(oc)
}

// addAnswers adds a route's successful answers; those of one status are
// one of their bodies.
func addAnswers(oc openapi.OperationContext, answers []answer) {
	var statuses []int
	for _, a := range answers {
		if !slices.Contains(statuses, a.status) {
			statuses = append(statuses, a.status)
		}
	}
	for _, code := range statuses {
		var bodies []any
		var descriptions []string
		contentType := ""
		for _, a := range answers {
			if a.status != code {
				continue
			}
			if a.body != nil {
				bodies = append(bodies, a.body)
			}
			if a.description != "" {
				descriptions = append(descriptions, a.description)
			}
			contentType = a.contentType
		}
		var body any
		switch len(bodies) {
		case 0:
		case 1:
			body = bodies[0]
		default:
			body = jsonschema.OneOf(bodies...)
		}
		opts := []openapi.ContentOption{openapi.WithHTTPStatus(code), withDescription(strings.Join(descriptions, "; "))}
		if contentType != "" {
			opts = append(opts, openapi.WithContentType(contentType))
		}
		oc.AddRespStructure(body, opts...)
	}
}

// errorStatuses are the statuses of a route's errors, its own and its
// access's, in order.
func errorStatuses(rt route) []int {
	codes := append(slices.Clone(rt.errors), errorsOf(rt.access, rt.body != nil)...)
	slices.Sort(codes)
	return slices.Compact(codes)
}

// errorDescription names the error codes a status carries (handleError's
// status table, and the refusals before it).
func errorDescription(code int) string {
	var names []string
	for name, st := range status {
		if st == code {
			names = append(names, name)
		}
	}
	switch code {
	case http.StatusServiceUnavailable:
		names = append(names, runbox.EBusy) // the body budget (limits.go)
	}
	if len(names) == 0 {
		return http.StatusText(code)
	}
	slices.Sort(names)
	return http.StatusText(code) + ": " + strings.Join(names, ", ")
}

func retryAfter(resp *openapi31.Response) {
	resp.WithHeadersItem("Retry-After", openapi31.HeaderOrReference{Header: (&openapi31.Header{}).
		WithDescription("seconds to wait before trying again").
		WithSchema(map[string]any{"type": "integer"})})
}

func withDescription(d string) openapi.ContentOption {
	return func(cu *openapi.ContentUnit) { cu.Description = d }
}

// describe completes a property's schema as the MCP SDK's schemas read the
// same types (github.com/google/jsonschema-go): its jsonschema tag is its
// description, and a field that is never left out (no omitempty or
// omitzero) is required.
func describe(p jsonschema.InterceptPropParams) error {
	if !p.Processed {
		return nil
	}
	if d := p.Field.Tag.Get("jsonschema"); d != "" && p.PropertySchema.Description == nil {
		p.PropertySchema.WithDescription(d)
	}
	name, opts, _ := strings.Cut(p.Field.Tag.Get("json"), ",")
	if name != "" && name != "-" && !strings.Contains(opts, "omitempty") && !strings.Contains(opts, "omitzero") &&
		!slices.Contains(p.ParentSchema.Required, p.Name) {
		p.ParentSchema.Required = append(p.ParentSchema.Required, p.Name)
	}
	return nil
}

func (s *Server) openAPI(c echo.Context) error {
	// The document is public and read-only: any page may read it.
	c.Response().Header().Set("Access-Control-Allow-Origin", "*")
	return c.JSONBlob(http.StatusOK, s.doc.json)
}
