package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/runbox-dev/runbox"
	"github.com/runbox-dev/runbox/internal/testenv"
)

// The streaming sandbox server's clients: shell commands through
// execute_code and its family, parsed as json.loads(content[0].text).

// execOutput is an execution's answer as those clients read it.
type execOutput struct {
	ExecutionID string      `json:"execution_id"`
	Status      string      `json:"status"`
	ExitCode    *int        `json:"exit_code"`
	Output      []execEvent `json:"output"`
	Error       string      `json:"error"`
	Message     string      `json:"message"`
}

type execEvent struct {
	Type           string   `json:"type"`
	TS             float64  `json:"ts"`
	Data           *string  `json:"data"`
	Code           *int     `json:"code"`
	DurationMS     *int64   `json:"duration_ms"`
	TimeoutSeconds *int     `json:"timeout_seconds"`
	Message        string   `json:"message"`
	Stream         string   `json:"stream"`
	Extra          struct{} `json:"-"`
}

// lines returns the data of an output's events of one type.
func (o execOutput) lines(typ string) []string {
	var out []string
	for _, e := range o.Output {
		if e.Type == typ && e.Data != nil {
			out = append(out, *e.Data)
		}
	}
	return out
}

func (o execOutput) types() []string {
	var out []string
	for _, e := range o.Output {
		out = append(out, e.Type)
	}
	return out
}

func (o execOutput) event(typ string) *execEvent {
	for i := range o.Output {
		if o.Output[i].Type == typ {
			return &o.Output[i]
		}
	}
	return nil
}

// command calls a tool of the family as its clients do: the answer is
// json.loads(content[0].text), which must also be structuredContent.
func command(t *testing.T, cs *mcp.ClientSession, tool string, args map[string]any, out any) *mcp.CallToolResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: tool, Arguments: args})
	if err != nil {
		t.Fatalf("call %s: %v", tool, err)
	}
	tc, ok := res.Content[0].(*mcp.TextContent)
	if !ok {
		t.Fatalf("%s: content[0] is %T, not text", tool, res.Content[0])
	}
	var fromText, fromStructured any
	if err := json.Unmarshal([]byte(tc.Text), &fromText); err != nil {
		t.Fatalf("%s: content[0] is not JSON: %q", tool, tc.Text)
	}
	b, _ := json.Marshal(res.StructuredContent)
	_ = json.Unmarshal(b, &fromStructured)
	if a, b := mustJSON(fromText), mustJSON(fromStructured); a != b {
		t.Fatalf("%s: content[0] %s differs from structuredContent %s", tool, a, b)
	}
	if out != nil {
		if err := json.Unmarshal([]byte(tc.Text), out); err != nil {
			t.Fatalf("%s: decode %s: %v", tool, tc.Text, err)
		}
	}
	return res
}

func mustJSON(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

// execute runs a command and waits for it.
func execute(t *testing.T, cs *mcp.ClientSession, args map[string]any) execOutput {
	t.Helper()
	var o execOutput
	if res := command(t, cs, "execute_code", args, &o); res.IsError {
		t.Fatalf("execute_code %v: %s", args["command"], text(res))
	}
	return o
}

// refused calls a tool and expects a tool error with code.
func refused(t *testing.T, cs *mcp.ClientSession, tool string, args map[string]any, code string) string {
	t.Helper()
	var e toolError
	res := command(t, cs, tool, args, &e)
	if !res.IsError || e.Error != code {
		t.Fatalf("%s %v: %s, want the tool error %s", tool, args, text(res), code)
	}
	return e.Message
}

// waitOutput polls an execution until cond holds of its output.
func waitOutput(t *testing.T, cs *mcp.ClientSession, id string, cond func(execOutput) bool) execOutput {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		var o execOutput
		command(t, cs, "get_execution_output", map[string]any{"execution_id": id}, &o)
		if cond(o) {
			return o
		}
		if time.Now().After(deadline) {
			t.Fatalf("execution %s: %+v", id, o)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

func TestCommands(t *testing.T) {
	s := start(t, options{env: []string{"SANDBOX_MAX_PER_SESSION=2", "SANDBOX_MAX_CONCURRENT=3",
		"SANDBOX_QUOTA_BYTES=16777216", "MCP_API_TOKENS=alice:" + aliceToken}})
	cs := s.session(nil)

	t.Run("tools", func(t *testing.T) {
		list, err := cs.ListTools(context.Background(), nil)
		if err != nil {
			t.Fatal(err)
		}
		found := map[string]*mcp.Tool{}
		for _, tool := range list.Tools {
			found[tool.Name] = tool
		}
		for _, name := range []string{"execute_code", "execute_code_async", "get_execution_output", "send_stdin",
			"cancel_execution", "list_executions", "get_execution_status"} {
			tool := found[name]
			if tool == nil || tool.OutputSchema == nil || tool.Annotations == nil {
				t.Errorf("%s: %+v", name, tool)
			}
		}
		if a := found["get_execution_output"].Annotations; !a.ReadOnlyHint || *a.DestructiveHint {
			t.Errorf("get_execution_output annotations: %+v", a)
		}
		if a := found["execute_code"].Annotations; a.ReadOnlyHint || !*a.DestructiveHint || *a.OpenWorldHint {
			t.Errorf("execute_code annotations: %+v", a)
		}
	})

	t.Run("events", func(t *testing.T) {
		o := execute(t, cs, map[string]any{"command": "echo hello; echo oops >&2; echo; printf partial; exit 3"})
		if o.Status != "completed" || o.ExitCode == nil || *o.ExitCode != 3 || !strings.HasPrefix(o.ExecutionID, "run_") {
			t.Fatalf("%+v", o)
		}
		// Lines keep their order within a stream; the two streams are two
		// pipes, whose order between them no one knows.
		if got := o.types(); len(got) != 6 || got[0] != "ready" || got[5] != "exit" {
			t.Fatalf("events %s: %+v", got, o.Output)
		}
		if got := o.lines("stdout"); strings.Join(got, "|") != "hello||partial" {
			t.Errorf("stdout lines %q", got)
		}
		exit := o.event("exit")
		if *exit.Code != 3 || exit.DurationMS == nil || exit.TS < float64(time.Now().Add(-time.Minute).Unix()) || exit.TS > float64(time.Now().Unix()+1) {
			t.Errorf("exit %+v", exit)
		}
		for i := 1; i < len(o.Output); i++ {
			if o.Output[i].TS < o.Output[i-1].TS {
				t.Errorf("events out of order: %+v", o.Output)
			}
		}
	})

	t.Run("output streams as progress", func(t *testing.T) {
		var mu sync.Mutex
		var got []string
		ps := s.session(&mcp.ClientOptions{ProgressNotificationHandler: func(_ context.Context, req *mcp.ProgressNotificationClientRequest) {
			mu.Lock()
			defer mu.Unlock()
			got = append(got, req.Params.Message)
		}})
		params := &mcp.CallToolParams{Name: "execute_code", Arguments: map[string]any{"command": "echo first; sleep 1; echo second"}}
		params.SetProgressToken("exec-1")
		res, err := ps.CallTool(context.Background(), params)
		if err != nil || res.IsError {
			t.Fatalf("%v %s", err, text(res))
		}
		if joined := waitJoined(&mu, &got, "first\nsecond\n"); joined != "first\nsecond\n" {
			t.Fatalf("progress messages %q", joined)
		}
	})

	t.Run("what the box holds", func(t *testing.T) {
		o := execute(t, cs, map[string]any{"command": `python -c 'import pandas, numpy; print("py", 1+1)' && python3 -c 'print(3)' ` +
			`&& node -e 'console.log("node", 2*2)' && git --version >/dev/null && curl --version >/dev/null && echo '{"a":5}' | jq .a ` +
			`&& make --version >/dev/null && pip --version >/dev/null && python3 -m venv --without-pip /tmp/v && echo all`})
		if o.Status != "completed" || *o.ExitCode != 0 || strings.Join(o.lines("stdout"), ",") != "py 2,3,node 4,5,all" {
			t.Fatalf("%+v", o)
		}
	})

	t.Run("one folder for the session", func(t *testing.T) {
		execute(t, cs, map[string]any{"command": "mkdir -p sub && echo shared > /data/sub/f.txt"})
		o := execute(t, cs, map[string]any{"command": "pwd; cat f.txt; cat /mnt/data/sub/f.txt", "working_directory": "sub"})
		if strings.Join(o.lines("stdout"), ",") != "/data/sub,shared,shared" {
			t.Fatalf("%+v", o)
		}
		o = execute(t, cs, map[string]any{"command": "pwd", "working_directory": "/tmp"})
		if strings.Join(o.lines("stdout"), ",") != "/tmp" {
			t.Fatalf("%+v", o)
		}
		o = execute(t, cs, map[string]any{"command": "pwd", "working_directory": "missing"})
		if *o.ExitCode == 0 || len(o.lines("stderr")) == 0 {
			t.Fatalf("a missing working directory: %+v", o)
		}
		for _, dir := range []string{"/etc", "/data/../etc", "../x", "/"} {
			refused(t, cs, "execute_code", map[string]any{"command": "pwd", "working_directory": dir}, "invalid_argument")
		}
	})

	t.Run("environment", func(t *testing.T) {
		o := execute(t, cs, map[string]any{"command": `echo "$GREETING $HOME"`, "environment": map[string]any{"GREETING": "hi there"}})
		if strings.Join(o.lines("stdout"), ",") != "hi there /tmp" {
			t.Fatalf("%+v", o)
		}
		for _, env := range []map[string]any{{"HOME": "/data"}, {"PATH": "/tmp"}, {"https_proxy": "http://x"}, {"LD_PRELOAD": "/tmp/x.so"},
			{"1BAD": "x"}, {"A-B": "x"}, {"RUNBOX_USER": "0:0"}} {
			refused(t, cs, "execute_code", map[string]any{"command": "true", "environment": env}, "invalid_argument")
		}
	})

	t.Run("wait_for_completion false and get_execution_output", func(t *testing.T) {
		var started execOutput
		command(t, cs, "execute_code", map[string]any{"command": "sleep 1; echo done", "wait_for_completion": false}, &started)
		if started.Status != "running" || started.ExecutionID == "" || started.Output != nil {
			t.Fatalf("%+v", started)
		}
		var o execOutput
		command(t, cs, "get_execution_output", map[string]any{"execution_id": started.ExecutionID}, &o)
		if o.Status != "running" || o.ExitCode != nil {
			t.Errorf("at once: %+v", o)
		}
		command(t, cs, "get_execution_output", map[string]any{"execution_id": started.ExecutionID, "wait": true}, &o)
		if o.Status != "completed" || *o.ExitCode != 0 || strings.Join(o.lines("stdout"), ",") != "done" || o.event("exit") == nil {
			t.Fatalf("waited: %+v", o)
		}
	})

	t.Run("execute_code_async, status and list", func(t *testing.T) {
		var started execOutput
		command(t, cs, "execute_code_async", map[string]any{"command": "echo async; exit 4"}, &started)
		if started.Status != "running" {
			t.Fatalf("%+v", started)
		}
		waitOutput(t, cs, started.ExecutionID, func(o execOutput) bool { return o.Status == "completed" })
		var st map[string]any
		command(t, cs, "get_execution_status", map[string]any{"execution_id": started.ExecutionID}, &st)
		if st["status"] != "completed" || st["exit_code"] != float64(4) || st["command"] != "echo async; exit 4" ||
			st["started_at"] == nil || st["completed_at"] == nil || st["duration_ms"] == nil || st["id"] != started.ExecutionID {
			t.Fatalf("status %v", st)
		}
		var list struct {
			Executions []map[string]any `json:"executions"`
		}
		command(t, cs, "list_executions", map[string]any{}, &list)
		last := list.Executions[len(list.Executions)-1]
		if len(list.Executions) < 5 || last["id"] != started.ExecutionID || last["status"] != "completed" || last["command"] != "echo async; exit 4" {
			t.Fatalf("list %v", list)
		}
	})

	t.Run("timeout", func(t *testing.T) {
		o := execute(t, cs, map[string]any{"command": "echo before; sleep 30", "timeout_seconds": 1})
		ev := o.event("timeout")
		if o.Status != "timeout" || o.ExitCode != nil || ev == nil || *ev.TimeoutSeconds != 1 || strings.Join(o.lines("stdout"), ",") != "before" {
			t.Fatalf("%+v", o)
		}
		refused(t, cs, "execute_code", map[string]any{"command": "true", "timeout_seconds": 100000}, "invalid_argument")
	})

	// A program that says when it is asked to stop.
	const trapping = `trap 'echo got TERM; exit 7' TERM; echo up; sleep 60 & wait`
	for _, force := range []bool{false, true} {
		name := map[bool]string{false: "cancel", true: "cancel with force"}[force]
		t.Run(name, func(t *testing.T) {
			var started execOutput
			command(t, cs, "execute_code_async", map[string]any{"command": trapping}, &started)
			waitOutput(t, cs, started.ExecutionID, func(o execOutput) bool { return len(o.lines("stdout")) > 0 })
			var c map[string]any
			command(t, cs, "cancel_execution", map[string]any{"execution_id": started.ExecutionID, "force": force}, &c)
			if c["success"] != true || c["was_running"] != true || c["status"] != "cancelled" {
				t.Fatalf("cancel: %v", c)
			}
			var o execOutput
			command(t, cs, "get_execution_output", map[string]any{"execution_id": started.ExecutionID, "wait": true}, &o)
			told := strings.Contains(strings.Join(o.lines("stdout"), ","), "got TERM")
			if o.Status != "cancelled" || o.event("cancelled") == nil || told == force {
				t.Fatalf("force %v: %+v", force, o)
			}
			// Cancelling what has ended leaves it as it is.
			command(t, cs, "cancel_execution", map[string]any{"execution_id": started.ExecutionID}, &c)
			if c["was_running"] != false || c["status"] != "cancelled" {
				t.Fatalf("again: %v", c)
			}
		})
	}

	t.Run("error", func(t *testing.T) {
		// Past the session's quota the service stops the command.
		o := execute(t, cs, map[string]any{"command": "head -c 40000000 /dev/zero > /data/big; sleep 5"})
		ev := o.event("error")
		if o.Status != "error" || ev == nil || !strings.Contains(ev.Message, "quota") || strings.Contains(ev.Message, s.root) {
			t.Fatalf("%+v", o)
		}
		execute(t, cs, map[string]any{"command": "rm -f /data/big"})
	})

	t.Run("stdin", func(t *testing.T) {
		var started execOutput
		command(t, cs, "execute_code_async", map[string]any{"command": `read name; echo "hello $name"; read n; echo "n=$n"`, "interactive": true}, &started)
		var ok map[string]any
		command(t, cs, "send_stdin", map[string]any{"execution_id": started.ExecutionID, "input_data": "bob"}, &ok)
		command(t, cs, "send_stdin", map[string]any{"execution_id": started.ExecutionID, "input_data": "2\n"}, &ok)
		if ok["success"] != true {
			t.Fatalf("send_stdin: %v", ok)
		}
		o := waitOutput(t, cs, started.ExecutionID, func(o execOutput) bool { return o.Status != "running" })
		if strings.Join(o.lines("stdout"), ",") != "hello bob,n=2" {
			t.Fatalf("%+v", o)
		}
		// Not interactive: refused; both argument sets at once: refused.
		done := execute(t, cs, map[string]any{"command": "true"})
		refused(t, cs, "send_stdin", map[string]any{"execution_id": done.ExecutionID, "input_data": "x"}, "invalid_argument")
		refused(t, cs, "send_stdin", map[string]any{"execution_id": done.ExecutionID, "run_id": done.ExecutionID, "data": "x"}, "invalid_argument")
	})

	t.Run("output is bounded", func(t *testing.T) {
		o := execute(t, cs, map[string]any{"command": "yes line | head -n 200000; yes err | head -n 100 >&2"})
		b, _ := json.Marshal(o)
		if o.Status != "completed" || len(b) > 2<<20 || !strings.Contains(mustJSON(o.Output), `"truncated"`) {
			t.Fatalf("%d bytes, %d events, truncated %v", len(b), len(o.Output), strings.Contains(string(b), "truncated"))
		}
	})

	t.Run("filesystem rules", func(t *testing.T) {
		execute(t, cs, map[string]any{"command": "mkdir -p out keep && echo secret > keep/secret && echo open > open.txt"})
		rules := map[string]any{"filesystem": map[string]any{
			"allow_write": []string{"/data/out", "/data/keep"}, "deny_read": []string{"/data/keep/secret"}, "deny_write": []string{"keep/secret"}}}
		if underGVisor() {
			// gVisor has no Landlock: the rules are refused, not ignored.
			msg := refused(t, cs, "execute_code", map[string]any{"command": "true", "sandbox_config": rules}, "unsupported")
			if !strings.Contains(msg, "sandbox_config.filesystem") {
				t.Errorf("message %q", msg)
			}
			return
		}
		o := execute(t, cs, map[string]any{"command": `
try() { if eval "$2" >/dev/null 2>&1; then echo "$1 yes"; else echo "$1 no"; fi; }
try write-out 'echo x > /data/out/f'
try write-data 'echo x > /data/f'
try write-tmp 'echo x > /tmp/f'
try read-secret 'cat /data/keep/secret'
try read-open 'cat /data/open.txt'
try overwrite-secret 'echo y > /data/keep/secret'`, "sandbox_config": rules})
		want := "write-out yes,write-data no,write-tmp no,read-secret no,read-open yes,overwrite-secret no"
		if got := strings.Join(o.lines("stdout"), ","); got != want {
			t.Fatalf("got  %s\nwant %s", got, want)
		}
		// What the sandbox cannot hold to is refused, naming the field.
		msg := refused(t, cs, "execute_code", map[string]any{"command": "true",
			"sandbox_config": map[string]any{"filesystem": map[string]any{"allow_write": []string{"/usr/lib"}}}}, "unsupported")
		if !strings.Contains(msg, "allow_write") {
			t.Errorf("message %q", msg)
		}
		// A setting it does not know is never ignored.
		var e toolError
		res := command(t, cs, "execute_code", map[string]any{"command": "true",
			"sandbox_config": map[string]any{"filesystem": map[string]any{"allow_read": []string{"/"}}}}, &e)
		if !res.IsError {
			t.Fatalf("an unknown filesystem rule was accepted: %s", text(res))
		}
	})

	t.Run("network", func(t *testing.T) {
		msg := refused(t, cs, "execute_code", map[string]any{"command": "true",
			"sandbox_config": map[string]any{"network": map[string]any{"allowed_domains": []string{"example.com"}}}}, "egress_denied")
		if !strings.Contains(msg, "example.com") {
			t.Errorf("message %q", msg)
		}
		o := execute(t, cs, map[string]any{"command": "curl -sS -m 5 http://example.com/ || echo offline"})
		if !strings.Contains(strings.Join(o.lines("stdout"), ","), "offline") {
			t.Fatalf("a command reached the network: %+v", o)
		}
	})

	t.Run("sessions", func(t *testing.T) {
		a, b := s.session(nil), s.session(nil)
		alice := testenv.Session(t, s.url+"/mcp", aliceToken, nil)
		var started execOutput
		command(t, a, "execute_code_async", map[string]any{"command": "echo $$ > /data/pid; sleep 60"}, &started)
		waitOutput(t, a, started.ExecutionID, func(o execOutput) bool { return o.event("ready") != nil })
		for name, other := range map[string]*mcp.ClientSession{"another session": b, "another client": alice} {
			var list struct {
				Executions []map[string]any `json:"executions"`
			}
			command(t, other, "list_executions", nil, &list)
			for _, e := range list.Executions {
				if e["id"] == started.ExecutionID {
					t.Errorf("%s lists it", name)
				}
			}
			for _, tool := range []string{"get_execution_output", "get_execution_status", "cancel_execution"} {
				refused(t, other, tool, map[string]any{"execution_id": started.ExecutionID}, "not_found")
			}
			refused(t, other, "send_stdin", map[string]any{"execution_id": started.ExecutionID, "input_data": "x"}, "not_found")
			// Nor does its folder show.
			o := execute(t, other, map[string]any{"command": "ls /data"})
			if strings.Contains(strings.Join(o.lines("stdout"), ","), "pid") {
				t.Errorf("%s sees the folder", name)
			}
		}
		// Limits: two at once in a session, three in the server.
		var second execOutput
		command(t, a, "execute_code_async", map[string]any{"command": "sleep 60"}, &second)
		msg := refused(t, a, "execute_code_async", map[string]any{"command": "true"}, "too_many_executions")
		if !strings.Contains(msg, "2") {
			t.Errorf("message %q", msg)
		}
		var third execOutput
		command(t, b, "execute_code_async", map[string]any{"command": "sleep 60"}, &third)
		refused(t, alice, "execute_code", map[string]any{"command": "true"}, "too_many_executions")

		// The session ends (DELETE): its executions are cancelled and its
		// folder removed; b's go on.
		if err := a.Close(); err != nil {
			t.Fatal(err)
		}
		for _, id := range []string{started.ExecutionID, second.ExecutionID} {
			deadline := time.Now().Add(30 * time.Second)
			for st := s.runStatus(id); st != runbox.StatusCancelled; st = s.runStatus(id) {
				if time.Now().After(deadline) {
					t.Fatalf("%s after its session ended: %s", id, st)
				}
				time.Sleep(200 * time.Millisecond)
			}
		}
		var o execOutput
		command(t, b, "get_execution_output", map[string]any{"execution_id": third.ExecutionID}, &o)
		if o.Status != "running" {
			t.Errorf("another session's execution: %+v", o)
		}
		command(t, b, "cancel_execution", map[string]any{"execution_id": third.ExecutionID, "force": true}, nil)
		// A request with the ended session's id is told it is gone.
		req, _ := http.NewRequest(http.MethodDelete, s.url+"/mcp", nil)
		req.Header.Set("Authorization", "Bearer "+token)
		req.Header.Set("Mcp-Session-Id", a.ID())
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusNotFound || a.ID() == "" {
			t.Errorf("DELETE of an ended session (%q): %d", a.ID(), resp.StatusCode)
		}
	})
}

// TestCommandsStdio: the same tools over stdio, where the session is the
// client's connection: its end (the client exits) cancels what runs.
func TestCommandsStdio(t *testing.T) {
	s := start(t, options{})
	cmd := exec.Command(bin.api, "--stdio")
	cmd.Env = s.env
	var stderr syncBuffer
	cmd.Stderr = &stderr
	c := mcp.NewClient(&mcp.Implementation{Name: "commands-client", Version: "1"}, nil)
	cs, err := c.Connect(context.Background(), &mcp.CommandTransport{Command: cmd}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if t.Failed() {
			t.Logf("api --stdio said:\n%s", stderr.String())
		}
	}()
	o := execute(t, cs, map[string]any{"command": "echo over stdio"})
	if o.Status != "completed" || strings.Join(o.lines("stdout"), ",") != "over stdio" {
		t.Fatalf("%+v", o)
	}
	var started execOutput
	command(t, cs, "execute_code_async", map[string]any{"command": "sleep 120"}, &started)
	waitOutput(t, cs, started.ExecutionID, func(o execOutput) bool { return o.event("ready") != nil })
	var list struct {
		Executions []map[string]any `json:"executions"`
	}
	command(t, cs, "list_executions", nil, &list)
	if len(list.Executions) != 2 {
		t.Fatalf("list: %v", list)
	}
	if err := cs.Close(); err != nil {
		t.Logf("close: %v", err)
	}
	awaitCancelled(t, s, started.ExecutionID)
}

// TestCommandsSSE: over HTTP+SSE the session is the event stream: its
// close cancels what runs, and another stream is another session.
func TestCommandsSSE(t *testing.T) {
	s := start(t, options{})
	cs, other := s.sseSession(), s.sseSession()
	var started execOutput
	command(t, cs, "execute_code_async", map[string]any{"command": "sleep 120"}, &started)
	waitOutput(t, cs, started.ExecutionID, func(o execOutput) bool { return o.event("ready") != nil })
	refused(t, other, "get_execution_status", map[string]any{"execution_id": started.ExecutionID}, "not_found")
	if err := cs.Close(); err != nil {
		t.Logf("close: %v", err)
	}
	awaitCancelled(t, s, started.ExecutionID)
}

// awaitCancelled waits for an execution whose session ended to be
// cancelled.
func awaitCancelled(t *testing.T, s *service, id string) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	st := s.runStatus(id)
	for ; !st.Final(); st = s.runStatus(id) {
		if time.Now().After(deadline) {
			t.Fatalf("the execution runs on after its session ended: %s", st)
		}
		time.Sleep(200 * time.Millisecond)
	}
	if st != runbox.StatusCancelled {
		t.Fatalf("after its session ended: %s", st)
	}
}

// TestCommandsNetwork: sandbox_config.network is the egress allowlist
// of runs: a command reaches what it names within its client's
// allowlist, through runbox's proxy, and nothing denied_domains takes
// out of it; pip installs from an allowed index into the session.
func TestCommandsNetwork(t *testing.T) {
	w := newWorld(t)
	s := start(t, options{env: w.env()})
	cs := s.session(nil)
	get := fmt.Sprintf(`for h in files.test other.test; do curl -fsS -m 10 "http://$h:%d/hello" || echo " refused $h"; echo; done`, w.files)
	o := execute(t, cs, map[string]any{"command": get,
		"sandbox_config": map[string]any{"network": map[string]any{"allowed_domains": []string{"files.test", "other.test"}, "denied_domains": []string{"other.test"}}}})
	out := strings.Join(o.lines("stdout"), "\n")
	if !strings.Contains(out, fmt.Sprintf("hello from files.test:%d", w.files)) || !strings.Contains(out, "refused other.test") ||
		strings.Contains(out, "hello from other.test") {
		t.Fatalf("%s\n%+v", out, o)
	}
	// Without network asked for, nothing.
	o = execute(t, cs, map[string]any{"command": get})
	if out := strings.Join(o.lines("stdout"), "\n"); strings.Contains(out, "hello from") {
		t.Fatalf("a command without network reached %s", out)
	}
	refused(t, cs, "execute_code", map[string]any{"command": "true",
		"sandbox_config": map[string]any{"network": map[string]any{"allowed_domains": []string{"elsewhere.test"}}}}, "egress_denied")

	// pip, as a command, from the index the network allows; the next
	// command of the session imports what it installed.
	o = execute(t, cs, map[string]any{"command": "pip install -q tinypkg==0.1.0 && echo installed",
		"sandbox_config": map[string]any{"network": map[string]any{"allowed_domains": []string{"pypi.test"}}}})
	if o.Status != "completed" || *o.ExitCode != 0 || !w.index.fetched("tinypkg-0.1.0-py3-none-any.whl") {
		t.Fatalf("pip install: %+v", o)
	}
	o = execute(t, cs, map[string]any{"command": `python -c 'import tinypkg; print(tinypkg.X)'`})
	if strings.Join(o.lines("stdout"), ",") != "42" {
		t.Fatalf("import after the install: %+v", o)
	}
}
