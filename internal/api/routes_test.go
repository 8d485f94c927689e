package api

import (
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"

	"github.com/labstack/echo/v4"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/runbox-dev/runbox"
	"github.com/runbox-dev/runbox/internal/queue"
	"github.com/runbox-dev/runbox/internal/store"
	"github.com/runbox-dev/runbox/internal/testenv"
)

// newTestServer is New with what serving the routes that touch no
// service needs.
func newTestServer(t *testing.T) *Server {
	t.Helper()
	_, url := testenv.Miniredis(t)
	conn := store.NewConn(testenv.Client(t, url))
	return New(Options{
		Dashboard: queue.Dashboard(conn, "/monitoring"), QueueMetrics: queue.NewCollector(conn),
		Registry: prometheus.NewRegistry(), BodyBudget: 1 << 20,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)),
	})
}

// notREST are the routes the document leaves out: the MCP transports
// (JSON-RPC, described by MCP) and the queue dashboard (asynqmon's UI).
func notREST(path string) bool {
	return path == "/mcp" || path == "/mcp/events" || path == "/monitoring" || strings.HasPrefix(path, "/monitoring/")
}

// TestEveryRouteDocumented walks the routes Echo serves: each is an
// operation of the document, and each operation a route, so that a route
// registered besides the table, or declared in it but not served, fails.
func TestEveryRouteDocumented(t *testing.T) {
	s := newTestServer(t)
	served := map[string]bool{}
	for _, r := range s.echo.Routes() {
		// Echo's catch-alls of groups with middleware answer 404s.
		if r.Method == echo.RouteNotFound || notREST(r.Path) {
			continue
		}
		served[r.Method+" "+r.Path] = true
	}
	documented := map[string]bool{}
	for path, item := range s.doc.spec.Paths.MapOfPathItemValues {
		for _, method := range methods {
			if operation(item, method) != nil {
				documented[method+" "+path] = true
			}
		}
	}
	for _, r := range s.routes() {
		if !served[r.method+" "+r.echoPath()] {
			t.Errorf("%s %s is in the table but Echo does not serve %s", r.method, r.path, r.echoPath())
		}
		delete(served, r.method+" "+r.echoPath())
		if !documented[r.method+" "+r.docPath()] {
			t.Errorf("%s %s is in the table but not in the document", r.method, r.path)
		}
		delete(documented, r.method+" "+r.docPath())
	}
	for r := range served {
		t.Errorf("Echo serves %s, which the route table does not declare", r)
	}
	for op := range documented {
		t.Errorf("the document has %s, which the route table does not declare", op)
	}
}

// TestRoutePaths checks the two spellings of a route's path.
func TestRoutePaths(t *testing.T) {
	for _, tc := range []struct{ path, echo, doc string }{
		{"/v1/runs", "/v1/runs", "/v1/runs"},
		{"/v1/runs/{id}/events", "/v1/runs/:id/events", "/v1/runs/{id}/events"},
		{"/v1/conversations/{cid}/files/{name...}", "/v1/conversations/:cid/files/*", "/v1/conversations/{cid}/files/{name}"},
		{"/files/{path...}", "/files/*", "/files/{path}"},
	} {
		r := route{path: tc.path}
		if r.echoPath() != tc.echo || r.docPath() != tc.doc {
			t.Errorf("%s: echo %s, doc %s; want %s, %s", tc.path, r.echoPath(), r.docPath(), tc.echo, tc.doc)
		}
	}
}

// TestRoutesAreSound checks what the document cannot: every operation has
// an id and a tag of the document, a token's routes are under /v1 (the
// group that checks it), and no two routes share an id.
func TestRoutesAreSound(t *testing.T) {
	ids := map[string]bool{}
	for _, r := range new(Server).routes() {
		if r.id == "" || ids[r.id] {
			t.Errorf("%s %s: operationId %q is empty or taken", r.method, r.path, r.id)
		}
		ids[r.id] = true
		if !slices.Contains([]string{tagRuns, tagBatches, tagConversations, tagService}, r.tag) {
			t.Errorf("%s %s: tag %q", r.method, r.path, r.tag)
		}
		if (r.access == bearer) != strings.HasPrefix(r.path, "/v1/") {
			t.Errorf("%s %s: a token guards exactly the routes under /v1", r.method, r.path)
		}
		if r.handler == nil || len(r.answers) == 0 {
			t.Errorf("%s %s has no handler or no answer", r.method, r.path)
		}
	}
}

// TestRepliesKeepTheirJSON: the named types the handlers answer with
// marshal to the bytes of the maps they replaced.
func TestRepliesKeepTheirJSON(t *testing.T) {
	runsList := []runbox.Run{{ID: "run_1", ConversationID: "c", Language: "bash", Status: runbox.StatusQueued}}
	for _, tc := range []struct {
		name      string
		got, want any
	}{
		{"runs", runList{Runs: runsList}, map[string]any{"runs": runsList}},
		{"no runs", runList{}, map[string]any{"runs": []runbox.Run(nil)}},
		{"cancel", runCancelled{RunID: "run_1", Status: runbox.StatusCancelled}, map[string]any{"run_id": "run_1", "status": runbox.StatusCancelled}},
		{"stdin", okReply{OK: true}, map[string]bool{"ok": true}},
		{"runners", runnerList{Languages: []runbox.Runner{}}, map[string]any{"languages": []runbox.Runner{}}},
		{"files", fileList{Files: []runbox.FileInfo{{Name: "a"}}}, map[string]any{"files": []runbox.FileInfo{{Name: "a"}}}},
		{"closed", statusReply{Status: "closed"}, map[string]string{"status": "closed"}},
		{"health", statusReply{Status: "ok"}, map[string]string{"status": "ok"}},
		{"ready", readiness{"redis": "ok"}, map[string]string{"redis": "ok"}},
		{"error", errorReply{Error: "not_found", Message: "m"}, map[string]any{"error": "not_found", "message": "m"}},
		{"limited", errorReply{Error: "rate_limited", Message: "m", RetryAfterSeconds: 3},
			map[string]any{"error": "rate_limited", "message": "m", "retry_after_seconds": 3}},
	} {
		got, _ := json.Marshal(tc.got)
		want, _ := json.Marshal(tc.want)
		if string(got) != string(want) {
			t.Errorf("%s: %s, want %s", tc.name, got, want)
		}
	}
}

// TestDocumentServed: /openapi.json is the document and /reference its
// page, to anyone (no token, any origin), the page under a policy that
// lets it load nothing.
func TestDocumentServed(t *testing.T) {
	s := newTestServer(t)
	get := func(path string) *http.Response {
		req := httptest.NewRequest(http.MethodGet, path, nil)
		req.Header.Set("Origin", "https://elsewhere.example")
		w := httptest.NewRecorder()
		s.ServeHTTP(w, req)
		return w.Result()
	}
	res := get("/openapi.json")
	body, _ := io.ReadAll(res.Body)
	if res.StatusCode != http.StatusOK || string(body) != string(s.doc.json) ||
		res.Header.Get("Access-Control-Allow-Origin") != "*" || !strings.HasPrefix(res.Header.Get("Content-Type"), "application/json") {
		t.Errorf("/openapi.json: %d %v", res.StatusCode, res.Header)
	}
	res = get("/reference")
	body, _ = io.ReadAll(res.Body)
	if res.StatusCode != http.StatusOK || res.Header.Get("Content-Security-Policy") != referenceCSP ||
		!strings.HasPrefix(res.Header.Get("Content-Type"), "text/html") {
		t.Errorf("/reference: %d %v", res.StatusCode, res.Header)
	}
	page := string(body)
	for _, r := range s.routes() {
		if !strings.Contains(page, `id="op-`+r.id+`"`) {
			t.Errorf("the page lacks %s %s", r.method, r.path)
		}
	}
	for name := range s.doc.spec.Components.Schemas {
		if !strings.Contains(page, `id="schema-`+name+`"`) {
			t.Errorf("the page lacks the schema %s", name)
		}
	}
	if strings.Contains(page, "<script") || strings.Contains(page, "http://") || strings.Contains(page, "https://") {
		t.Error("the page loads or links something outside the server")
	}
}
