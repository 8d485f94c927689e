package testenv

import (
	"context"
	"encoding/json"
	"net/http"
	"testing"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// Bearer is an HTTP transport that sends a bearer token, if it has one.
type Bearer struct{ Token string }

// RoundTrip sends r with the token.
func (b Bearer) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	if b.Token != "" {
		r.Header.Set("Authorization", "Bearer "+b.Token)
	}
	return http.DefaultTransport.RoundTrip(r)
}

// Session connects the official MCP client to endpoint over Streamable
// HTTP with token, closed when the test ends.
func Session(t testing.TB, endpoint, token string, opts *mcp.ClientOptions) *mcp.ClientSession {
	t.Helper()
	return SessionOver(t, endpoint, Bearer{token}, opts)
}

// SessionOver is Session with the client's HTTP requests sent through
// transport.
func SessionOver(t testing.TB, endpoint string, transport http.RoundTripper, opts *mcp.ClientOptions) *mcp.ClientSession {
	t.Helper()
	c := mcp.NewClient(&mcp.Implementation{Name: "runbox-test", Version: "1"}, opts)
	cs, err := c.Connect(context.Background(), &mcp.StreamableClientTransport{
		Endpoint: endpoint, HTTPClient: &http.Client{Transport: transport},
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cs.Close() })
	return cs
}

// Ready asks an api's /readyz and returns its status and its checks.
func Ready(t testing.TB, baseURL string) (int, map[string]string) {
	t.Helper()
	resp, err := http.Get(baseURL + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	checks := map[string]string{}
	if err := json.NewDecoder(resp.Body).Decode(&checks); err != nil {
		t.Fatalf("readyz: %v", err)
	}
	return resp.StatusCode, checks
}
