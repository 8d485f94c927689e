package e2e

import (
	"net/http"
	"strings"
	"testing"
)

// TestOrigin: MCP (both transports) and REST refuse a browser's request
// from a page elsewhere with 403 before they look at its token, and
// accept requests without Origin, from the server's own pages and from
// MCP_ALLOWED_ORIGINS.
func TestOrigin(t *testing.T) {
	s := start(t, options{env: []string{"MCP_ALLOWED_ORIGINS=https://app.example.com"}})
	initialize := `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}`
	tests := []struct {
		name, method, path, origin, token string
		want                              int
	}{
		{"mcp, no origin", "POST", "/mcp", "", token, http.StatusOK},
		{"mcp, own origin", "POST", "/mcp", s.url, token, http.StatusOK},
		{"mcp, allowed origin", "POST", "/mcp", "https://app.example.com", token, http.StatusOK},
		{"mcp, other origin", "POST", "/mcp", "http://evil.example", token, http.StatusForbidden},
		{"mcp, other origin, no token", "POST", "/mcp", "http://evil.example", "", http.StatusForbidden},
		{"mcp, own origin, no token", "POST", "/mcp", s.url, "", http.StatusUnauthorized},
		{"sse, other origin", "GET", "/mcp/events", "http://evil.example", token, http.StatusForbidden},
		{"rest, other origin", "GET", "/v1/runners", "http://evil.example", token, http.StatusForbidden},
		{"rest, own origin", "GET", "/v1/runners", s.url, token, http.StatusOK},
		{"playground, other origin", "GET", "/", "http://evil.example", "", http.StatusOK},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req, err := http.NewRequest(tt.method, s.url+tt.path, strings.NewReader(initialize))
			if err != nil {
				t.Fatal(err)
			}
			if tt.method == "GET" {
				req.Body = http.NoBody
			}
			req.Header.Set("Content-Type", "application/json")
			req.Header.Set("Accept", "application/json, text/event-stream")
			if tt.origin != "" {
				req.Header.Set("Origin", tt.origin)
			}
			if tt.token != "" {
				req.Header.Set("Authorization", "Bearer "+tt.token)
			}
			res, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			res.Body.Close()
			if res.StatusCode != tt.want {
				t.Errorf("status %d, want %d", res.StatusCode, tt.want)
			}
		})
	}
}
