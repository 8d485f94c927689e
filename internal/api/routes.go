package api

import (
	"net/http"
	"regexp"
	"slices"
	"strings"

	"github.com/labstack/echo/v4"

	"github.com/runbox-dev/runbox"
	"github.com/runbox-dev/runbox/internal/conversations"
	"github.com/runbox-dev/runbox/internal/preview"
	"github.com/runbox-dev/runbox/internal/runs"
)

// A route is one route of the REST API, declared once: New registers its
// handler with Echo and the OpenAPI document (openapi.go) describes it from
// the same entry — its parameters, body and answers are the Go types its
// handler binds, decodes and writes. A route is added by adding an entry
// here (or to a list these functions return): the test that walks Echo's
// routes fails for a route registered any other way.
type route struct {
	method string
	// path is in OpenAPI's form, /v1/runs/{id}; a last {name...} takes the
	// rest of the path, slashes included (Echo's *).
	path    string
	id      string // the operationId, which names the generated client's method
	tag     string
	summary string
	access  access
	// params are the path, query and header parameters: a struct whose
	// fields are tagged path, query or header (bind reads them so).
	params any
	// body is the request body: a value of the type the handler decodes
	// from JSON, or a raw value for bytes of any kind.
	body any
	// answers are the route's successful answers; errors the statuses of
	// the errors it answers with besides those of its access (errorsOf).
	answers []answer
	errors  []int
	handler echo.HandlerFunc
}

// An answer is one successful response: a status, the value the handler
// writes as JSON (nil: none, or bytes of contentType).
type answer struct {
	status      int
	body        any
	contentType string
	description string
}

// raw stands for a body of bytes, not JSON.
type raw struct{ contentType string }

// access is who may call a route.
type access int

const (
	public access = iota
	// bearer: a client's API token (MCP_API_TOKEN(S), CLIENTS_FILE).
	bearer
	// metricsBearer: METRICS_TOKEN as a bearer token, when it is set.
	metricsBearer
)

// routes are the REST API's routes, every one of them: New registers
// them, document describes them.
func (s *Server) routes() []route {
	return slices.Concat(s.runRoutes(), s.deliveryRoutes(), s.batchRoutes(), s.conversationRoutes(), s.serviceRoutes(), s.docRoutes())
}

// echoPath is the route's path as Echo writes it: {id} is :id, a last
// {name...} is *.
func (r route) echoPath() string {
	p := r.path
	if strings.HasSuffix(p, "...}") {
		p = p[:strings.LastIndex(p, "{")] + "*"
	}
	return pathParam.ReplaceAllString(p, ":$1")
}

// docPath is the route's path as OpenAPI writes it.
func (r route) docPath() string { return strings.ReplaceAll(r.path, "...}", "}") }

var pathParam = regexp.MustCompile(`\{([a-zA-Z_]+)\}`)

// errorsOf are the errors every route of an access may answer with: those
// of the token check, the origin guard, the limits on requests in flight
// and bodies, and of the server itself.
func errorsOf(a access, hasBody bool) []int {
	var codes []int
	switch a {
	case bearer:
		codes = []int{http.StatusUnauthorized, http.StatusForbidden, http.StatusTooManyRequests, http.StatusServiceUnavailable}
		if hasBody {
			codes = append(codes, http.StatusRequestEntityTooLarge)
		}
	case metricsBearer:
		codes = []int{http.StatusUnauthorized}
	}
	return append(codes, http.StatusInternalServerError)
}

// Tags group the routes in the document.
const (
	tagRuns          = "runs"
	tagConversations = "conversations"
	tagService       = "service"
)

// The status codes, short.
const (
	s200 = http.StatusOK
	s201 = http.StatusCreated
	s202 = http.StatusAccepted
	s206 = http.StatusPartialContent
	s304 = http.StatusNotModified
	s400 = http.StatusBadRequest
	s403 = http.StatusForbidden
	s404 = http.StatusNotFound
	s409 = http.StatusConflict
	s416 = http.StatusRequestedRangeNotSatisfiable
	s429 = http.StatusTooManyRequests
	s503 = http.StatusServiceUnavailable
	s507 = http.StatusInsufficientStorage
)

func (s *Server) runRoutes() []route {
	return []route{
		{method: "POST", path: "/v1/runs", id: "createRun", tag: tagRuns, access: bearer,
			summary: "Start a run (body as run_code's arguments); with wait=true, answer when it is done",
			params:  createRunParams{}, body: runs.StartRequest{},
			answers: []answer{
				{status: s202, body: runAccepted{}, description: "Queued: follow it at events_url or GET /v1/runs/{id}"},
				{status: s200, body: runbox.Result{}, description: "wait=true: the run's Result"},
				{status: s200, body: runbox.Run{}, description: "wait=true with background: the Run, once its program has started"},
			},
			errors: []int{s400, s404, s507}, handler: s.createRun},
		{method: "GET", path: "/v1/runs", id: "listRuns", tag: tagRuns, access: bearer,
			summary: "The caller's recent runs, newest first", params: listRunsParams{},
			answers: []answer{{status: s200, body: runList{}}}, errors: []int{s400}, handler: s.listRuns},
		{method: "GET", path: "/v1/runs/{id}", id: "getRun", tag: tagRuns, access: bearer,
			summary: "A run's status and, when it is done, its Result", params: runParams{},
			answers: []answer{{status: s200, body: runbox.Run{}}}, errors: []int{s404}, handler: s.getRun},
		{method: "DELETE", path: "/v1/runs/{id}", id: "cancelRun", tag: tagRuns, access: bearer,
			summary: "Cancel a run", params: runParams{},
			answers: []answer{{status: s200, body: runCancelled{}}}, errors: []int{s404}, handler: s.cancelRun},
		{method: "POST", path: "/v1/runs/{id}/stdin", id: "sendStdin", tag: tagRuns, access: bearer,
			summary: "Input for a run started with interactive: true", params: runParams{}, body: stdinBody{},
			answers: []answer{{status: s200, body: okReply{}}}, errors: []int{s400, s404}, handler: s.sendStdin},
		{method: "GET", path: "/v1/runs/{id}/events", id: "streamRunEvents", tag: tagRuns, access: bearer,
			summary: "The run's events as server-sent events: every one from the first (or after Last-Event-ID), then live ones, until done",
			params:  eventsParams{},
			answers: []answer{{status: s200, contentType: "text/event-stream", description: "Server-sent events: id is the event's seq, " +
				"event its type, data the Event as JSON (components/schemas/Event); done is always last"}},
			errors: []int{s400, s404}, handler: s.runEvents},
		{method: "GET", path: "/v1/runners", id: "listRunners", tag: tagRuns, access: bearer,
			summary: "The languages this server runs, their images and versions",
			answers: []answer{{status: s200, body: runnerList{}}}, handler: s.listRunners},
	}
}

// fileAnswers are the answers of a file's download (http.ServeContent).
var fileAnswers = []answer{
	{status: s200, contentType: "*/*", description: "The file, with its type; Range requests are answered"},
	{status: s206, contentType: "*/*", description: "The range asked for"},
	{status: s304, description: "Not modified since If-Modified-Since"},
}

func (s *Server) conversationRoutes() []route {
	return []route{
		{method: "GET", path: "/v1/conversations/{cid}/files", id: "listFiles", tag: tagConversations, access: bearer,
			summary: "A conversation's files, each with a signed download URL", params: conversationParams{},
			answers: []answer{{status: s200, body: fileList{}}}, errors: []int{s400, s404}, handler: s.listFiles},
		{method: "PUT", path: "/v1/conversations/{cid}/files/{name}", id: "uploadFile", tag: tagConversations, access: bearer,
			summary: "Upload the body's bytes as a file of the conversation (made if new)", params: uploadParams{},
			body:    raw{contentType: "application/octet-stream"},
			answers: []answer{{status: s201, body: conversations.Uploaded{}}}, errors: []int{s400, s409, s507}, handler: s.uploadFile},
		{method: "GET", path: "/v1/conversations/{cid}/files/{name...}", id: "getFile", tag: tagConversations, access: bearer,
			summary: "A file of the conversation", params: fileParams{},
			answers: fileAnswers, errors: []int{s400, s404, s416}, handler: s.getFile},
		{method: "DELETE", path: "/v1/conversations/{cid}", id: "closeConversation", tag: tagConversations, access: bearer,
			summary: "Cancel the conversation's runs and delete its files (as close_session)", params: conversationParams{},
			answers: []answer{{status: s200, body: statusReply{}}}, errors: []int{s400, s404}, handler: s.closeConversation},
		{method: "POST", path: "/v1/conversations/{cid}/fork", id: "forkConversation", tag: tagConversations, access: bearer,
			summary: "New conversations, each with a copy of the conversation's files and installed packages (as fork_conversation)",
			params:  conversationParams{}, body: forkBody{},
			answers: []answer{{status: s201, body: conversations.Forks{}}}, errors: []int{s400, s404, s409, s507}, handler: s.forkConversation},
		{method: "POST", path: "/v1/conversations/{cid}/pause", id: "pauseConversation", tag: tagConversations, access: bearer,
			summary: "Save the conversation's kept interpreter's state and let its sandbox go (as pause_session)",
			params:  conversationParams{}, answers: []answer{{status: s200, body: runs.KeptState{}}},
			errors: []int{s400, s404}, handler: s.pauseConversation},
		{method: "POST", path: "/v1/conversations/{cid}/resume", id: "resumeConversation", tag: tagConversations, access: bearer,
			summary: "Bring the conversation's paused kept interpreter back now (as resume_session)",
			params:  conversationParams{}, answers: []answer{{status: s200, body: runs.KeptState{}}},
			errors: []int{s400, s404}, handler: s.resumeConversation},
		{method: "POST", path: "/v1/conversations/{cid}/previews", id: "createPreview", tag: tagConversations, access: bearer,
			summary: "A URL a browser opens to reach a port a program of the conversation listens on (as get_preview_url)",
			params:  conversationParams{}, body: previewBody{},
			answers: []answer{{status: s201, body: preview.URL{}}}, errors: []int{s400, s404, s409}, handler: s.createPreview},
	}
}

func (s *Server) serviceRoutes() []route {
	return []route{
		{method: "GET", path: "/files/{path...}", id: "downloadFile", tag: tagService, access: public,
			summary: "A file, by the signed URL a listing or a result gave (no token: the signature is the key)",
			params:  downloadParams{}, answers: fileAnswers, errors: []int{s403, s404, s416}, handler: s.download},
		{method: "HEAD", path: "/files/{path...}", id: "headFile", tag: tagService, access: public,
			summary: "As GET, without the body", params: downloadParams{},
			answers: []answer{{status: s200}, {status: s304}}, errors: []int{s403, s404}, handler: s.download},
		{method: "GET", path: "/healthz", id: "health", tag: tagService, access: public,
			summary: "The process is up", answers: []answer{{status: s200, body: statusReply{}}}, handler: s.health},
		{method: "GET", path: "/readyz", id: "ready", tag: tagService, access: public,
			summary: "Each dependency answers",
			answers: []answer{{status: s200, body: readiness{}}, {status: s503, body: readiness{}, description: "A dependency does not answer"}},
			handler: s.ready},
		{method: "GET", path: "/metrics", id: "metrics", tag: tagService, access: metricsBearer,
			summary: "Prometheus metrics",
			answers: []answer{{status: s200, contentType: "text/plain", description: "The Prometheus text format"}},
			handler: s.serveMetrics},
		{method: "GET", path: "/", id: "playground", tag: tagService, access: public,
			summary: "The playground: a page that runs code through this API",
			answers: []answer{{status: s200, contentType: "text/html"}}, handler: s.playground},
	}
}

func (s *Server) docRoutes() []route {
	return []route{
		{method: "GET", path: "/openapi.json", id: "openAPI", tag: tagService, access: public,
			summary: "This document", answers: []answer{{status: s200, body: openAPIDocument{}}}, handler: s.openAPI},
		{method: "GET", path: "/reference", id: "reference", tag: tagService, access: public,
			summary: "This document as a page", answers: []answer{{status: s200, contentType: "text/html"}}, handler: s.reference},
	}
}
