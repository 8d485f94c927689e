package api

import (
	"net/http"
	"net/http/httptest"
	"testing"
)

// TestOriginGuard: on the api's routes a request without Origin, or from
// the server's own origin or an allowed one, goes on; any other is refused
// with 403 before the handler runs or a byte of its body is read. Other
// routes are not the guard's.
func TestOriginGuard(t *testing.T) {
	g := newOriginGuard([]string{"http://localhost:8080", "https://app.example.com"}, apiRoute)
	tests := []struct {
		name, path string
		origins    []string
		want       int
	}{
		{"no origin", "/mcp", nil, http.StatusOK},
		{"own origin", "/mcp", []string{"http://localhost:8080"}, http.StatusOK},
		{"own origin, loopback alias", "/v1/runs", []string{"http://127.0.0.1:8080"}, http.StatusOK},
		{"own origin, IPv6 loopback", "/v1/runs", []string{"http://[::1]:8080"}, http.StatusOK},
		{"allowed origin", "/mcp/events", []string{"https://app.example.com"}, http.StatusOK},
		{"allowed origin, default port and case", "/mcp", []string{"HTTPS://App.Example.com:443"}, http.StatusOK},
		{"evil origin", "/mcp", []string{"http://evil.example"}, http.StatusForbidden},
		{"evil origin on SSE", "/mcp/events", []string{"http://evil.example"}, http.StatusForbidden},
		{"evil origin on REST", "/v1/runs", []string{"http://evil.example"}, http.StatusForbidden},
		{"rebound name at the server's port", "/mcp", []string{"http://evil.example:8080"}, http.StatusForbidden},
		{"own host, other port", "/mcp", []string{"http://localhost:9999"}, http.StatusForbidden},
		{"own host, other scheme", "/mcp", []string{"https://localhost:8080"}, http.StatusForbidden},
		{"allowed host, other scheme", "/mcp", []string{"http://app.example.com"}, http.StatusForbidden},
		{"opaque origin", "/mcp", []string{"null"}, http.StatusForbidden},
		{"origin with a path", "/mcp", []string{"http://localhost:8080/x"}, http.StatusForbidden},
		{"two origins", "/mcp", []string{"http://localhost:8080", "http://evil.example"}, http.StatusForbidden},
		{"downloads are not guarded", "/files/c/a.txt", []string{"http://evil.example"}, http.StatusOK},
		{"the playground is not guarded", "/", []string{"http://evil.example"}, http.StatusOK},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ran := false
			h := g.wrap(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				ran = true
				w.WriteHeader(http.StatusOK)
			}))
			body := &countingReader{left: 1 << 20}
			req := httptest.NewRequest(http.MethodPost, tt.path, body)
			for _, o := range tt.origins {
				req.Header.Add("Origin", o)
			}
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, req)
			if rec.Code != tt.want {
				t.Fatalf("status %d, want %d", rec.Code, tt.want)
			}
			if tt.want == http.StatusForbidden {
				if ran || body.read.Load() != 0 {
					t.Errorf("refused, yet the handler ran (%v) or the body was read (%d bytes)", ran, body.read.Load())
				}
				if got := rec.Body.String(); got != `{"error":"forbidden","message":"requests from this web origin are not accepted"}` {
					t.Errorf("body %s", got)
				}
			}
		})
	}
}
