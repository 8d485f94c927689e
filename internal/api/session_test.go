package api

import (
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/runbox-dev/runbox/internal/sessions"
	"github.com/runbox-dev/runbox/internal/store"
	"github.com/runbox-dev/runbox/internal/testenv"
)

// TestWithSessions: Streamable HTTP's sessions as runbox keeps them — an
// initialize (or server/discover) opens one and answers its id, a call
// with it runs in it, DELETE ends it, and an ended or made-up id is not
// found; a call without one is sessionless.
func TestWithSessions(t *testing.T) {
	_, url := testenv.Miniredis(t)
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	ss := sessions.New(store.New(store.NewConn(testenv.Client(t, url))), time.Hour, clockwork.NewRealClock(), log)
	var seen sessions.Ref
	s := &Server{opts: Options{Sessions: ss, MaxBody: 1 << 20}, log: log}
	h := s.withSessions(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seen, _ = sessions.From(r.Context())
		b, _ := io.ReadAll(r.Body)
		w.Write(b) // the body reaches the SDK whole
	}))
	do := func(method, id, body string) *httptest.ResponseRecorder {
		req := httptest.NewRequest(method, "/mcp", strings.NewReader(body))
		if id != "" {
			req.Header.Set(sessionHeader, id)
		}
		rec := httptest.NewRecorder()
		seen = sessions.Ref{Client: "unset"}
		h.ServeHTTP(rec, req)
		return rec
	}
	for _, open := range []string{
		`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{}}`,
		`{"jsonrpc":"2.0","id":1,"method":"server/discover"}`,
		`[{"jsonrpc":"2.0","id":1,"method":"initialize"}]`,
	} {
		rec := do(http.MethodPost, "", open)
		id := rec.Header().Get(sessionHeader)
		if !sessions.ValidID(id) || seen.ID != id || rec.Body.String() != open {
			t.Fatalf("%s: id %q, seen %+v, body %q", open, id, seen, rec.Body.String())
		}
		if rec := do(http.MethodPost, id, `{"jsonrpc":"2.0","id":2,"method":"tools/list"}`); rec.Code != 200 || seen.ID != id {
			t.Fatalf("a call in the session: %d, %+v", rec.Code, seen)
		}
		if rec := do(http.MethodDelete, id, ""); rec.Code != http.StatusNoContent {
			t.Fatalf("DELETE: %d", rec.Code)
		}
		if rec := do(http.MethodPost, id, `{}`); rec.Code != http.StatusNotFound || seen.Client != "unset" {
			t.Fatalf("a call in an ended session: %d", rec.Code)
		}
		if rec := do(http.MethodDelete, id, ""); rec.Code != http.StatusNotFound {
			t.Fatalf("DELETE again: %d", rec.Code)
		}
	}
	if rec := do(http.MethodPost, "", `{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"initialize"}}`); rec.Header().Get(sessionHeader) != "" || seen.ID != "" || seen.Client != "default" {
		t.Fatalf("a sessionless call: %+v, %v", seen, rec.Header())
	}
	for _, id := range []string{"nope", "../../etc", strings.Repeat("A", 26)} {
		if rec := do(http.MethodPost, id, `{}`); rec.Code != http.StatusNotFound {
			t.Errorf("made-up id %q: %d", id, rec.Code)
		}
	}
	if rec := do(http.MethodDelete, "", ""); rec.Code != http.StatusBadRequest {
		t.Errorf("DELETE without an id: %d", rec.Code)
	}
}
