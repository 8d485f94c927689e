package e2e

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/runbox-dev/runbox"
	"github.com/runbox-dev/runbox/internal/store"
	"github.com/runbox-dev/runbox/internal/testenv"
)

// runStatus reads a run's status where the service keeps it: a session's
// runs are no client's to see from outside the session.
func (s *service) runStatus(id string) runbox.Status {
	s.t.Helper()
	run, err := store.New(store.NewConn(testenv.Client(s.t, s.redisURL))).Run(context.Background(), id)
	if err != nil {
		s.t.Fatalf("run %s: %v", id, err)
	}
	return run.Status
}

// TestSessionScope: an execution is found only through the MCP session
// that started it, by the run tools too. Another session of the same
// client — and REST, outside any session — finds neither the run (list,
// get, stdin, cancel) nor the session's conversation (runs, files,
// previews, close), and no answer names the session.
func TestSessionScope(t *testing.T) {
	s := start(t, options{})
	a, b := s.session(nil), s.session(nil)
	conv := "mcp-" + a.ID()
	var started execOutput
	command(t, a, "execute_code_async", map[string]any{"command": "read x; echo got $x", "interactive": true}, &started)
	id := started.ExecutionID
	waitOutput(t, a, id, func(o execOutput) bool { return o.event("ready") != nil })

	var list struct {
		Runs []runbox.Run `json:"runs"`
	}
	call(t, a, "list_runs", nil, &list)
	if len(list.Runs) != 1 || list.Runs[0].ID != id || list.Runs[0].ConversationID != conv {
		t.Fatalf("its own session's list_runs: %+v", list.Runs)
	}
	if res := call(t, a, "get_run", map[string]any{"run_id": id}, nil); res.IsError {
		t.Fatalf("its own session's get_run: %s", text(res))
	}

	// Another session of the same client.
	res := call(t, b, "list_runs", nil, nil)
	if res.IsError || strings.Contains(text(res), id) || strings.Contains(text(res), a.ID()) {
		t.Errorf("another session's list_runs: %s", text(res))
	}
	for _, c := range []struct {
		tool string
		args map[string]any
	}{
		{"get_run", map[string]any{"run_id": id}},
		{"send_stdin", map[string]any{"run_id": id, "data": "evil\n"}},
		{"cancel_run", map[string]any{"run_id": id}},
		{"list_runs", map[string]any{"conversationId": conv}},
		{"run_code", map[string]any{"language": "bash", "conversationId": conv, "code": "ls /data"}},
		{"list_files", map[string]any{"conversationId": conv}},
		{"get_preview_url", map[string]any{"conversationId": conv, "port": 8000}},
		{"close_session", map[string]any{"conversationId": conv}},
	} {
		var te toolError
		res := call(t, b, c.tool, c.args, &te)
		if !res.IsError || te.Error != "not_found" {
			t.Errorf("another session's %s: %s", c.tool, text(res))
		}
		// A run's answer says nothing of the session it is in.
		if _, named := c.args["conversationId"]; !named && strings.Contains(text(res), a.ID()) {
			t.Errorf("another session's %s names the session: %s", c.tool, text(res))
		}
	}
	// REST is outside any session.
	var runs struct {
		Runs []runbox.Run `json:"runs"`
	}
	if code := s.request("GET", "/v1/runs", nil, &runs); code != http.StatusOK {
		t.Errorf("GET /v1/runs: %d", code)
	}
	if b, _ := json.Marshal(runs); strings.Contains(string(b), id) || strings.Contains(string(b), a.ID()) {
		t.Errorf("GET /v1/runs lists the session's run: %s", b)
	}
	for _, r := range []struct{ method, path string }{
		{"GET", "/v1/runs/" + id}, {"GET", "/v1/runs/" + id + "/events"}, {"DELETE", "/v1/runs/" + id},
		{"POST", "/v1/runs/" + id + "/stdin"}, {"GET", "/v1/conversations/" + conv + "/files"},
		{"DELETE", "/v1/conversations/" + conv},
	} {
		if code, _ := s.restAs(token, r.method, r.path, `{"data":"evil\n","port":8000}`); code != http.StatusNotFound {
			t.Errorf("%s %s: %d", r.method, r.path, code)
		}
	}

	// None of it reached the execution: its session feeds and follows it.
	if st := s.runStatus(id); st != runbox.StatusRunning {
		t.Fatalf("the execution after the other session's calls: %s", st)
	}
	call(t, a, "send_stdin", map[string]any{"run_id": id, "data": "hello\n"}, nil)
	o := waitOutput(t, a, id, func(o execOutput) bool { return o.Status != "running" })
	if got := strings.Join(o.lines("stdout"), ","); got != "got hello" {
		t.Errorf("its output: %q", got)
	}
}
