package e2e

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/runbox-dev/runbox/internal/testenv"
)

const (
	aliceToken = "alice-token-0123456789"
	bobToken   = "bob-token-0123456789"
	carolToken = "carol-token-0123456789"
	daveToken  = "dave-token-0123456789"
	erinToken  = "erin-token-0123456789"

	metricsToken = "metrics-token-0123456789"
)

// tenants starts a service with four named clients: alice and bob
// unlimited, carol at 5 calls a minute, dave at one run at a time and 2
// run-seconds a day.
func tenants(t *testing.T) *service {
	t.Helper()
	file := filepath.Join(t.TempDir(), "clients.yaml")
	os.WriteFile(file, []byte(`
tiers:
  five: {calls_per_minute: 5}
  one-run: {concurrent_runs: 1, run_seconds_per_day: 2}
  small: {new_conversations_per_hour: 2, max_timeout_seconds: 5, storage_bytes: 100000}
clients:
  - {name: dave, token: `+daveToken+`, tier: one-run}
  - {name: erin, token: `+erinToken+`, tier: small}
`), 0o600)
	return start(t, options{env: []string{
		"MCP_API_TOKENS=alice:" + aliceToken + ",bob:" + bobToken + ",carol:" + carolToken + ":five",
		"CLIENTS_FILE=" + file,
		"METRICS_TOKEN=" + metricsToken,
	}})
}

func (s *service) sessionAs(tok string) *mcp.ClientSession {
	s.t.Helper()
	return s.sessionAt(s.url, tok)
}

func (s *service) sessionAt(url, tok string) *mcp.ClientSession {
	s.t.Helper()
	return testenv.Session(s.t, url+"/mcp", tok, nil)
}

// restAs makes a REST call with a token and returns the status and the
// Retry-After header.
func (s *service) restAs(tok, method, path, body string) (int, string) {
	s.t.Helper()
	req, _ := http.NewRequest(method, s.url+path, strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+tok)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		s.t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode, resp.Header.Get("Retry-After")
}

// toolErrorOf returns the tool error of a result, or "" when it succeeded.
func toolErrorOf(res *mcp.CallToolResult) (code string, retry int) {
	if !res.IsError {
		return "", 0
	}
	var e struct {
		Error string `json:"error"`
		Retry int    `json:"retry_after_seconds"`
	}
	_ = jsonUnmarshal(text(res), &e)
	return e.Error, e.Retry
}

func TestTenantsOwnership(t *testing.T) {
	s := tenants(t)
	alice, bob := s.sessionAs(aliceToken), s.sessionAs(bobToken)

	// The same conversationId from two clients is two conversations.
	write := func(cs *mcp.ClientSession, who string) result {
		return runCode(t, cs, map[string]any{"language": "bash", "conversationId": "demo",
			"code": "cat /data/who.txt 2>/dev/null; echo " + who + " > /data/who.txt; ls /data"})
	}
	ra := write(alice, "alice")
	rb := write(bob, "bob")
	if strings.TrimSpace(rb.Stdout) != "who.txt" || !strings.Contains(ra.Stdout, "who.txt") {
		t.Fatalf("bob saw alice's folder: alice %q, bob %q", ra.Stdout, rb.Stdout)
	}
	if ra.ConversationID != "demo" || rb.ConversationID != "demo" {
		t.Errorf("conversation ids %q %q, want demo", ra.ConversationID, rb.ConversationID)
	}
	if !strings.Contains(ra.Files[0].URL, "/files/~alice/demo/who.txt?") {
		t.Errorf("alice's URL %s", ra.Files[0].URL)
	}
	if status, body := get(t, ra.Files[0].URL); status != 200 || strings.TrimSpace(string(body)) != "alice" {
		t.Errorf("alice's download: %d %q", status, body)
	}
	if status, body := get(t, rb.Files[0].URL); status != 200 || strings.TrimSpace(string(body)) != "bob" {
		t.Errorf("bob's download: %d %q", status, body)
	}
	// A URL of alice's with bob's path (or the default client's) is refused.
	forged := strings.Replace(ra.Files[0].URL, "~alice/demo", "~bob/demo", 1)
	if status, _ := get(t, forged); status != http.StatusForbidden {
		t.Errorf("forged URL: %d", status)
	}
	forged = strings.Replace(ra.Files[0].URL, "~alice/demo", "demo", 1)
	if status, _ := get(t, forged); status != http.StatusForbidden {
		t.Errorf("alice's signature on the default client's path: %d", status)
	}

	// Every tool that names alice's run, from bob: not_found.
	started := startRun(t, alice, map[string]any{"language": "bash", "conversationId": "demo", "code": "read x; echo got $x", "interactive": true})
	for _, c := range []struct {
		tool string
		args map[string]any
	}{
		{"get_run", map[string]any{"run_id": started.RunID}},
		{"cancel_run", map[string]any{"run_id": started.RunID}},
		{"send_stdin", map[string]any{"run_id": started.RunID, "data": "evil\n"}},
		{"get_run", map[string]any{"run_id": ra.RunID}},
	} {
		res := call(t, bob, c.tool, c.args, nil)
		if code, _ := toolErrorOf(res); code != "not_found" {
			t.Errorf("bob %s on alice's run: %s", c.tool, text(res))
		}
	}
	// And over REST.
	for _, c := range []struct{ method, path, body string }{
		{"GET", "/v1/runs/" + started.RunID, ""},
		{"GET", "/v1/runs/" + started.RunID + "/events", ""},
		{"POST", "/v1/runs/" + started.RunID + "/stdin", `{"data":"evil\n"}`},
		{"DELETE", "/v1/runs/" + started.RunID, ""},
	} {
		if status, _ := s.restAs(bobToken, c.method, c.path, c.body); status != http.StatusNotFound {
			t.Errorf("bob %s %s: %d, want 404", c.method, c.path, status)
		}
	}
	// Alice's run was not touched: it reads her input.
	call(t, alice, "send_stdin", map[string]any{"run_id": started.RunID, "data": "hers\n", "eof": true}, nil)
	res, _ := waitRun(t, alice, started.RunID)
	if strings.TrimSpace(res.Stdout) != "got hers" {
		t.Errorf("alice's interactive run: %+v", res)
	}

	// Lists show the caller's own only.
	var runs struct {
		Runs []struct {
			RunID string `json:"run_id"`
		} `json:"runs"`
	}
	call(t, bob, "list_runs", nil, &runs)
	for _, r := range runs.Runs {
		if r.RunID == ra.RunID || r.RunID == started.RunID {
			t.Errorf("bob's list_runs shows alice's run %s", r.RunID)
		}
	}
	if len(runs.Runs) != 1 || runs.Runs[0].RunID != rb.RunID {
		t.Errorf("bob's runs: %+v", runs.Runs)
	}
	var files struct {
		Files []fileInfo `json:"files"`
	}
	call(t, bob, "list_files", map[string]any{"conversationId": "demo"}, &files)
	if len(files.Files) != 1 || !strings.Contains(files.Files[0].URL, "~bob/demo") {
		t.Errorf("bob's files: %+v", files.Files)
	}
	var read struct {
		Content string `json:"content"`
	}
	res2 := call(t, bob, "read_file", map[string]any{"conversationId": "demo", "path": "who.txt"}, &read)
	if !strings.Contains(text(res2), "bob") || strings.Contains(text(res2), "alice") {
		t.Errorf("bob's read_file: %s", text(res2))
	}

	// Bob closes his demo; alice's stays.
	call(t, bob, "close_session", map[string]any{"conversationId": "demo"}, nil)
	if status, body := get(t, ra.Files[0].URL); status != 200 || strings.TrimSpace(string(body)) != "alice" {
		t.Errorf("alice's file after bob closed his demo: %d %q", status, body)
	}
	// The default client's "demo" is yet another conversation.
	def := s.session(nil)
	rd := runCode(t, def, map[string]any{"language": "bash", "conversationId": "demo", "code": "ls /data | wc -l"})
	if strings.TrimSpace(rd.Stdout) != "0" {
		t.Errorf("the default client's demo is not empty: %q", rd.Stdout)
	}
}

func TestTenantsTiers(t *testing.T) {
	s := tenants(t)
	carol, alice := s.sessionAs(carolToken), s.sessionAs(aliceToken)
	// A second api on the same Redis, started first: the limit frees a
	// call every 12 s, and its start must not take that from the check
	// below that it shares carol's count.
	port := testenv.FreePort(t)
	url2 := fmt.Sprintf("http://127.0.0.1:%d", port)
	s.spawn("api2", bin.api, "MCP_HTTP_ADDR=127.0.0.1:"+strconv.Itoa(port))
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := http.Get(url2 + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatal("second api not ready")
		}
		time.Sleep(100 * time.Millisecond)
	}

	// Five calls a minute: the sixth is refused, with when to retry;
	// listing tools does not count.
	for i := range 5 {
		if _, err := carol.ListTools(context.Background(), nil); err != nil {
			t.Fatal(err)
		}
		res := call(t, carol, "list_runners", nil, nil)
		if code, _ := toolErrorOf(res); code != "" {
			t.Fatalf("call %d refused: %s", i+1, text(res))
		}
	}
	res := call(t, carol, "list_runners", nil, nil)
	if code, retry := toolErrorOf(res); code != "rate_limited" || retry < 1 || retry > 60 {
		t.Errorf("sixth call: %s", text(res))
	}
	if status, retry := s.restAs(carolToken, "GET", "/v1/runners", ""); status != http.StatusTooManyRequests || retry == "" {
		t.Errorf("REST past the limit: %d, Retry-After %q", status, retry)
	}
	// Another client is untouched.
	for range 8 {
		if code, _ := toolErrorOf(call(t, alice, "list_runners", nil, nil)); code != "" {
			t.Fatal("alice was limited by carol's calls")
		}
	}
	// Operators see each client's calls and refusals, behind METRICS_TOKEN.
	if status, _ := get(t, s.url+"/metrics"); status != http.StatusUnauthorized {
		t.Errorf("/metrics without its token: %d", status)
	}
	req, _ := http.NewRequest("GET", s.url+"/metrics", nil)
	req.Header.Set("Authorization", "Bearer "+metricsToken)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	for _, want := range []string{`runbox_client_calls_total{client="carol"} 7`, `runbox_client_limited_total{client="carol",error="rate_limited"} 2`,
		`runbox_client_calls_total{client="alice"} 8`} {
		if !strings.Contains(string(body), want) {
			t.Errorf("/metrics lacks %s", want)
		}
	}

	// A second api on the same Redis shares the count.
	carol2 := s.sessionAt(url2, carolToken)
	if code, _ := toolErrorOf(call(t, carol2, "list_runners", nil, nil)); code != "rate_limited" {
		t.Error("the second api did not share carol's count")
	}
	// Both apis wrote to one audit chain, which verifies.
	alice2 := s.sessionAt(url2, aliceToken)
	call(t, alice2, "list_runners", nil, nil)
	code, out, errOut := s.auditCmd("export")
	if code != 0 {
		t.Fatalf("audit export: %s", errOut)
	}
	calls := 0
	for _, l := range parseAudit(t, out) {
		if l.Client == "alice" && l.Tool == "list_runners" && l.Phase == "end" {
			calls++
		}
	}
	if calls != 9 { // eight through the first api, one through the second
		t.Errorf("%d of alice's calls in the audit log, want 9", calls)
	}
	if code, _, errOut := s.auditCmd("verify"); code != 0 {
		t.Errorf("audit verify with two apis: %s", errOut)
	}

	// One run at a time, and 2 run-seconds a day.
	dave := s.sessionAs(daveToken)
	long := startRun(t, dave, map[string]any{"language": "bash", "code": "sleep 3"})
	res = call(t, dave, "start_run", map[string]any{"language": "bash", "code": "true"}, nil)
	if code, retry := toolErrorOf(res); code != "rate_limited" || retry < 1 {
		t.Errorf("second concurrent run: %s", text(res))
	}
	waitRun(t, dave, long.RunID)
	res = call(t, dave, "run_code", map[string]any{"language": "bash", "code": "true"}, nil)
	if code, retry := toolErrorOf(res); code != "quota_exceeded" || retry < 1 {
		t.Errorf("run past the day's run-seconds: %s", text(res))
	}
	if status, retry := s.restAs(daveToken, "POST", "/v1/runs", `{"language":"bash","code":"true"}`); status != http.StatusTooManyRequests || retry == "" {
		t.Errorf("REST run past the day's run-seconds: %d %q", status, retry)
	}

	// Longest timeout, new conversations an hour, storage.
	erin := s.sessionAs(erinToken)
	res = call(t, erin, "run_code", map[string]any{"language": "bash", "code": "true", "timeout_seconds": 10}, nil)
	if code, _ := toolErrorOf(res); code != "invalid_argument" {
		t.Errorf("timeout past the tier's: %s", text(res))
	}
	for _, cid := range []string{"one", "two", "one"} {
		if code, _ := toolErrorOf(call(t, erin, "run_code", map[string]any{"language": "bash", "conversationId": cid, "code": "true"}, nil)); code != "" {
			t.Fatalf("conversation %s refused", cid)
		}
	}
	res = call(t, erin, "run_code", map[string]any{"language": "bash", "conversationId": "three", "code": "true"}, nil)
	if code, retry := toolErrorOf(res); code != "rate_limited" || retry < 1 {
		t.Errorf("third new conversation in an hour: %s", text(res))
	}
	res = call(t, erin, "upload_file", map[string]any{"conversationId": "four", "filename": "x.txt", "content_base64": "eA=="}, nil)
	if code, _ := toolErrorOf(res); code != "rate_limited" {
		t.Errorf("an upload that starts a conversation past the limit: %s", text(res))
	}
	runCode(t, erin, map[string]any{"language": "bash", "conversationId": "one", "code": "head -c 200000 /dev/zero > /data/big"})
	res = call(t, erin, "run_code", map[string]any{"language": "bash", "conversationId": "two", "code": "true"}, nil)
	if code, retry := toolErrorOf(res); code != "quota_exceeded" || retry < 1 {
		t.Errorf("run past the client's storage: %s", text(res))
	}
}
