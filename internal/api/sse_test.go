package api

import (
	"bufio"
	"context"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	mcpsdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/runbox-dev/runbox/internal/auth"
	"github.com/runbox-dev/runbox/internal/clients"
)

// TestSSEOwner: a message for an HTTP+SSE session is taken only from the
// client that opened its stream; another client's valid token is
// refused (403) and its call never runs, as the stream's client or at
// all.
func TestSSEOwner(t *testing.T) {
	var ran atomic.Int32
	server := mcpsdk.NewServer(&mcpsdk.Implementation{Name: "t", Version: "1"}, nil)
	mcpsdk.AddTool(server, &mcpsdk.Tool{Name: "whoami"}, func(ctx context.Context, _ *mcpsdk.CallToolRequest, _ struct{}) (*mcpsdk.CallToolResult, any, error) {
		ran.Add(1)
		return &mcpsdk.CallToolResult{Content: []mcpsdk.Content{&mcpsdk.TextContent{Text: auth.Client(ctx)}}}, nil, nil
	})
	h := newSSEHandler(func() *mcpsdk.Server { return server }, 1<<20)
	// The token's client, as requireToken sets it.
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		who := r.Header.Get("X-Client")
		h.ServeHTTP(w, r.WithContext(auth.WithClient(r.Context(), clients.Client{Name: who})))
	}))
	defer srv.Close()

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL+"/mcp/events", nil)
	req.Header.Set("X-Client", "alice")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	events := bufio.NewScanner(resp.Body)
	endpoint := ""
	for endpoint == "" && events.Scan() {
		if data, ok := strings.CutPrefix(events.Text(), "data: "); ok {
			endpoint = data
		}
	}
	if !strings.Contains(endpoint, "sessionid=") {
		t.Fatalf("endpoint %q", endpoint)
	}
	post := func(who, body string) int {
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, srv.URL+endpoint, strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("X-Client", who)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	const (
		initialize  = `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2024-11-05","capabilities":{},"clientInfo":{"name":"c","version":"1"}}}`
		initialized = `{"jsonrpc":"2.0","method":"notifications/initialized","params":{}}`
		whoami      = `{"jsonrpc":"2.0","id":2,"method":"tools/call","params":{"name":"whoami","arguments":{}}}`
	)
	if code := post("bob", initialize); code != http.StatusForbidden {
		t.Fatalf("another client's initialize: %d", code)
	}
	if code := post("alice", initialize); code != http.StatusAccepted {
		t.Fatalf("its client's initialize: %d", code)
	}
	post("alice", initialized)
	if code := post("bob", whoami); code != http.StatusForbidden {
		t.Errorf("another client's call: %d", code)
	}
	if code := post("alice", whoami); code != http.StatusAccepted {
		t.Errorf("its client's call: %d", code)
	}
	// The answers on the stream: initialize's, then alice's call's only.
	var answers []string
	for len(answers) < 2 && events.Scan() {
		if data, ok := strings.CutPrefix(events.Text(), "data: "); ok {
			answers = append(answers, data)
		}
	}
	if len(answers) != 2 || !strings.Contains(answers[1], `"text":"alice"`) || ran.Load() != 1 {
		t.Errorf("answers %q, the tool ran %d times", answers, ran.Load())
	}
	endpoint = strings.Replace(endpoint, "sessionid=", "sessionid=X", 1)
	if code := post("alice", whoami); code != http.StatusNotFound {
		t.Errorf("an unknown session: %d", code)
	}
}
