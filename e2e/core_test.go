package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/runbox-dev/runbox/internal/testenv"
)

// allLanguages are the runners built from runners/.
var allLanguages = []string{"bash", "c", "cpp", "go", "java", "javascript", "php", "python", "r", "ruby", "rust", "shell", "sql", "typescript"}

// TestMCP is the core acceptance: the official SDK client over Streamable
// HTTP against api, an executor, redis-server and Docker.
func TestMCP(t *testing.T) {
	s := start(t, options{})
	cs := s.session(nil)

	t.Run("list_runners", func(t *testing.T) {
		var out struct {
			Languages []struct{ Language, Image, Version string } `json:"languages"`
		}
		call(t, cs, "list_runners", nil, &out)
		var langs []string
		for _, l := range out.Languages {
			langs = append(langs, l.Language)
			if l.Image == "" || l.Version == "" {
				t.Errorf("runner %+v lacks image or version", l)
			}
		}
		// Every runner of runners/ (others may be built on the same engine),
		// or every one the test cluster has.
		for _, want := range offeredLanguages() {
			if !slices.Contains(langs, want) {
				t.Errorf("languages %v lack %s", langs, want)
			}
		}
	})

	t.Run("tools are listed by their names, not aliases", func(t *testing.T) {
		res, err := cs.ListTools(context.Background(), nil)
		if err != nil {
			t.Fatal(err)
		}
		var names []string
		for _, tool := range res.Tools {
			names = append(names, tool.Name)
			if strings.ContainsAny(tool.Name, ".-") {
				t.Errorf("tool name %q is not ^[a-z_]+$", tool.Name)
			}
		}
		for _, want := range []string{"run_code", "list_runners"} {
			if !slices.Contains(names, want) {
				t.Errorf("tools %v lack %s", names, want)
			}
		}
	})

	tests := []struct {
		name       string
		args       map[string]any
		wantOut    string
		wantErr    string
		wantCode   int
		wantFailed bool
	}{
		{name: "python", args: map[string]any{"language": "python", "code": "print(2+2)"}, wantOut: "4\n"},
		{name: "typescript with types", args: map[string]any{"language": "typescript",
			"code": "import { basename } from 'node:path';\ninterface P { n: number }\nconst p: P = { n: 40 };\nconsole.log(basename('/x/y.ts'), p.n + 2);"},
			wantOut: "y.ts 42\n"},
		{name: "bash", args: map[string]any{"language": "bash", "code": "echo $((6 * 7)); echo oops >&2"}, wantOut: "42\n", wantErr: "oops"},
		{name: "failing program", args: map[string]any{"language": "python", "code": "def f():\n    raise ValueError('bad value')\nf()"},
			wantErr: "Traceback (most recent call last)", wantCode: 1, wantFailed: true},
		{name: "stdin and env", args: map[string]any{"language": "python", "code": "import os\nprint(input(), os.environ['GREETING'])",
			"stdin": "world\n", "env": map[string]string{"GREETING": "hello"}}, wantOut: "world hello\n"},
		{name: "alias sandbox.run_code", args: map[string]any{"language": "bash", "code": "echo via-alias"}, wantOut: "via-alias\n"},
		{name: "no network", args: map[string]any{"language": "python",
			"code": "import socket\ntry:\n    socket.create_connection(('93.184.216.34', 80), timeout=3)\n    print('connected')\nexcept OSError:\n    print('no network')"},
			wantOut: "no network\n"},
		{name: "non-root without capabilities", args: map[string]any{"language": "python",
			// gVisor's /proc/<pid>/status has no NoNewPrivs line: prctl says.
			"code": "import ctypes, os\nprint(os.getuid())\nprint(*[l for l in open('/proc/self/status') if l.startswith('CapEff')], end='')\n" +
				"print('no_new_privs', ctypes.CDLL(None).prctl(39, 0, 0, 0, 0))"},
			wantOut: "1000\nCapEff:\t0000000000000000\nno_new_privs 1\n"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			name := "run_code"
			if strings.HasPrefix(tt.name, "alias ") {
				name = strings.TrimPrefix(tt.name, "alias ")
			}
			var r result
			res := call(t, cs, name, tt.args, &r)
			if res.IsError {
				t.Fatalf("tool error: %s", text(res))
			}
			if r.Stdout != tt.wantOut || !strings.Contains(r.Stderr, tt.wantErr) {
				t.Errorf("stdout %q stderr %q, want %q and %q", r.Stdout, r.Stderr, tt.wantOut, tt.wantErr)
			}
			if r.ExitCode != tt.wantCode || r.Success == tt.wantFailed {
				t.Errorf("exit %d success %v, want %d %v", r.ExitCode, r.Success, tt.wantCode, !tt.wantFailed)
			}
			if r.Output != r.Stdout+r.Stderr {
				t.Errorf("output %q is not stdout then stderr", r.Output)
			}
			if !strings.HasPrefix(r.ConversationID, "sess_") || len(r.ConversationID) != 17 || !strings.HasPrefix(r.RunID, "run_") {
				t.Errorf("ids %q %q", r.ConversationID, r.RunID)
			}
			if !strings.Contains(text(res), `"run_id":"`+r.RunID) {
				t.Errorf("text block does not carry the result JSON: %s", text(res))
			}
		})
	}

	t.Run("run_python alias", func(t *testing.T) {
		var r result
		res := call(t, cs, "run_python", map[string]any{"code": "import sys; print(sys.version_info[0])"}, &r)
		if res.IsError || r.Stdout != "3\n" {
			t.Errorf("run_python: %s", text(res))
		}
	})

	t.Run("timeout", func(t *testing.T) {
		start := time.Now()
		r := runCode(t, cs, map[string]any{"language": "python", "timeout_seconds": 2, "conversationId": "endless",
			"code": "print(open('/etc/hostname').read().strip(), flush=True)\nwhile True:\n    pass"})
		// The program is stopped at its timeout. Its duration ends when
		// the agent's stream does, after the kill, which under gVisor on
		// a loaded machine took 1.5 s (CI); the call also waits for a
		// sandbox and for the killed one's removal. The bound tells a
		// stopped program from one left running, not a fast kill from a
		// slow one.
		if r.DurationMS > 8000 || time.Since(start) > 30*time.Second {
			t.Errorf("a 2 s timeout: the program ran %d ms, the call took %v", r.DurationMS, time.Since(start))
		}
		if !r.TimedOut || r.Success || r.ExitCode != -1 {
			t.Errorf("result %+v, want timed_out", r)
		}
		if host := strings.TrimSpace(r.Stdout); host == "" || s.containerExists(host) {
			t.Errorf("the sandbox %q of the timed-out run is still there", host)
		}
	})

	t.Run("conversations share nothing", func(t *testing.T) {
		// A's program leaves a file in /tmp, a variable in its
		// environment and a process behind; B sees none of them, nor A's
		// files.
		runCode(t, cs, map[string]any{"language": "bash", "conversationId": "iso-a",
			"code": "echo secret > /tmp/secret; echo a > a.txt; (setsid sleep 300 &); echo ok"})
		// test -e, not ls: gVisor (Debian's 2022 runsc) refuses the
		// AT_NO_AUTOMOUNT that coreutils' ls and stat pass (SECURITY.md).
		r := runCode(t, cs, map[string]any{"language": "bash", "conversationId": "iso-b",
			"code": "for f in /tmp/secret /data/a.txt; do test -e $f && echo $f; done; ps -eo comm | grep -c sleep; env | grep -c SECRET"})
		if r.Stdout != "0\n0\n" {
			t.Errorf("conversation B saw traces of A: %q", r.Stdout)
		}
	})

	t.Run("memory hog is oom_killed", func(t *testing.T) {
		r := runCode(t, cs, map[string]any{"language": "python", "code": "x = bytearray(2 << 30)\nprint('allocated')"})
		if !r.OOMKilled || r.Success {
			t.Errorf("result %+v, want oom_killed", r)
		}
	})

	t.Run("files and downloads", func(t *testing.T) {
		cid := "conv-files"
		r := runCode(t, cs, map[string]any{"language": "python", "conversationId": cid, "code": "import pandas as pd\n" +
			"pd.DataFrame({'a': [1, 2], 'b': ['x', 'y']}).to_csv('result.csv', index=False)\n" +
			"import os\nos.symlink('/etc/passwd', '/data/passwd-link')\nprint('written')"})
		if !r.Success || r.ConversationID != cid {
			t.Fatalf("result %+v", r)
		}
		if len(r.Files) != 1 || len(r.Artifacts) != 1 || r.Files[0].Name != "result.csv" {
			t.Fatalf("files %+v artifacts %+v: want only result.csv (links are not listed)", r.Files, r.Artifacts)
		}
		f := r.Files[0]
		if f.Path != "/data/result.csv" || f.MimeType != "text/csv; charset=utf-8" || f.SizeBytes != 12 {
			t.Errorf("file info %+v", f)
		}
		code, body := get(t, f.URL)
		if code != http.StatusOK || string(body) != "a,b\n1,x\n2,y\n" {
			t.Errorf("download: %d %q", code, body)
		}
		host, _ := os.ReadFile(s.root + "/" + cid + "/files/result.csv")
		if string(host) != string(body) {
			t.Errorf("downloaded bytes differ from the file")
		}

		// One changed hex digit of the signature.
		i := strings.Index(f.URL, "sig=") + 4
		d := byte('0')
		if f.URL[i] == '0' {
			d = '1'
		}
		if code, _ := get(t, f.URL[:i]+string(d)+f.URL[i+1:]); code != http.StatusForbidden {
			t.Errorf("tampered signature: %d, want 403", code)
		}
		// A correctly signed URL that has expired.
		if code, _ := get(t, s.sign(cid, "result.csv", time.Now().Add(-time.Minute).Unix())); code != http.StatusForbidden {
			t.Errorf("expired URL: %d, want 403", code)
		}
		// A correctly signed URL for the link to a host file.
		if code, body := get(t, s.sign(cid, "passwd-link", time.Now().Add(time.Hour).Unix())); code != http.StatusNotFound || strings.Contains(string(body), "root:") {
			t.Errorf("link to a host file: %d %q, want 404", code, body)
		}
		// The next run sees the file; nothing changed, so no artifacts.
		r = runCode(t, cs, map[string]any{"language": "bash", "conversationId": cid, "code": "cat result.csv | wc -l"})
		if r.Stdout != "3\n" || len(r.Artifacts) != 0 || len(r.Files) != 1 {
			t.Errorf("second run: %q, artifacts %v", r.Stdout, r.Artifacts)
		}
	})

	t.Run("progress notifications carry the output before the result", func(t *testing.T) {
		var mu sync.Mutex
		var got []string
		var times []time.Time
		tap := &wireTap{}
		cs := testenv.SessionOver(t, s.url+"/mcp", tap.wrap(bearer{Token: token}), &mcp.ClientOptions{
			ProgressNotificationHandler: func(_ context.Context, req *mcp.ProgressNotificationClientRequest) {
				if req.Params.Message == "" {
					return // a heartbeat
				}
				mu.Lock()
				defer mu.Unlock()
				got = append(got, req.Params.Message)
				times = append(times, time.Now())
			}})
		params := &mcp.CallToolParams{Name: "run_code", Arguments: map[string]any{"language": "python",
			"code": "import time, sys\nsys.stdout.write('first\\n')\nsys.stdout.flush()\ntime.sleep(2)\nsys.stderr.write('second\\n')"}}
		params.SetProgressToken("tok-1")
		before := len(tap.messages()) // the session's own
		res, err := cs.CallTool(context.Background(), params)
		if err != nil {
			t.Fatal(err)
		}
		returned := time.Now()
		if res.IsError {
			t.Error(text(res))
		}
		// On the wire, the result follows every notification. (Each line is
		// one write, so one notification; the test does not depend on it.)
		if order := tap.messages()[before:]; len(order) == 0 || order[len(order)-1] != "result" ||
			strings.Join(order[:len(order)-1], "") != "first\nsecond\n" {
			t.Errorf("the call's stream carried %q, want its output's notifications, then the result", order)
		}
		if joined := waitJoined(&mu, &got, "first\nsecond\n"); joined != "first\nsecond\n" {
			t.Fatalf("progress messages %q", joined)
		}
		mu.Lock()
		defer mu.Unlock()
		if times[0].After(returned) {
			t.Error("the first output arrived after the result, not as it was produced")
		}
		second := slices.IndexFunc(got, func(m string) bool { return strings.Contains(m, "second") })
		if gap := times[second].Sub(times[0]); gap < 1500*time.Millisecond {
			t.Errorf("output arrived %v apart, want it as produced (about 2s)", gap)
		}
	})

	t.Run("bad input", func(t *testing.T) {
		cases := []struct {
			name string
			args map[string]any
			code string
		}{
			{"empty code", map[string]any{"language": "python", "code": "  "}, "invalid_argument"},
			{"oversized code", map[string]any{"language": "python", "code": strings.Repeat("#", 102401)}, "too_large"},
			{"unknown language", map[string]any{"language": "cobol", "code": "x"}, "unknown_language"},
			{"malformed conversationId", map[string]any{"language": "python", "code": "x", "conversationId": "../etc"}, "invalid_argument"},
			{"conversationId too long", map[string]any{"language": "python", "code": "x", "conversationId": strings.Repeat("a", 65)}, "invalid_argument"},
			{"timeout too long", map[string]any{"language": "python", "code": "x", "timeout_seconds": 3600}, "invalid_argument"},
			{"negative timeout", map[string]any{"language": "python", "code": "x", "timeout_seconds": -1}, "invalid_argument"},
			{"bad env name", map[string]any{"language": "python", "code": "x", "env": map[string]string{"A=B": "1"}}, "invalid_argument"},
		}
		for _, c := range cases {
			t.Run(c.name, func(t *testing.T) {
				var e toolError
				res := call(t, cs, "run_code", c.args, &e)
				if !res.IsError || e.Error != c.code || e.Message == "" {
					t.Errorf("got isError=%v %+v, want %s", res.IsError, e, c.code)
				}
				if strings.Contains(e.Message, s.root) {
					t.Errorf("message leaks a host path: %s", e.Message)
				}
			})
		}
		t.Run("arguments of the wrong type", func(t *testing.T) {
			res := call(t, cs, "run_code", map[string]any{"language": 3, "code": "x"}, nil)
			if !res.IsError {
				t.Error("accepted")
			}
		})
	})

	t.Run("missing or wrong token is 401", func(t *testing.T) {
		for _, tok := range []string{"", "wrong-token-123"} {
			c := mcp.NewClient(&mcp.Implementation{Name: "e2e", Version: "1"}, nil)
			_, err := c.Connect(context.Background(), &mcp.StreamableClientTransport{
				Endpoint: s.url + "/mcp", HTTPClient: &http.Client{Transport: bearer{Token: tok}}, MaxRetries: -1,
			}, nil)
			if err == nil {
				t.Errorf("token %q: connected", tok)
			}
			req, _ := http.NewRequest("POST", s.url+"/mcp", strings.NewReader(`{"jsonrpc":"2.0","id":1,"method":"tools/list"}`))
			if tok != "" {
				req.Header.Set("Authorization", "Bearer "+tok)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusUnauthorized {
				t.Errorf("token %q: status %d", tok, resp.StatusCode)
			}
		}
	})
}

// TestREST runs programs through the REST API and replays SSE streams.
func TestREST(t *testing.T) {
	s := start(t, options{})

	t.Run("run and wait", func(t *testing.T) {
		var r result
		code := s.request("POST", "/v1/runs?wait=true", map[string]any{"language": "python", "code": "print(2+2)", "session_id": "rest-1"}, &r)
		if code != http.StatusOK || r.Stdout != "4\n" || !r.Success || r.ConversationID != "rest-1" {
			t.Fatalf("%d %+v", code, r)
		}
		var run struct {
			Status string  `json:"status"`
			Result *result `json:"result"`
		}
		s.request("GET", "/v1/runs/"+r.RunID, nil, &run)
		if run.Status != "succeeded" || run.Result == nil || run.Result.Stdout != "4\n" {
			t.Errorf("GET run: %+v", run)
		}
	})

	t.Run("runners", func(t *testing.T) {
		var out struct {
			Languages []struct{ Language string } `json:"languages"`
		}
		if code := s.request("GET", "/v1/runners", nil, &out); code != http.StatusOK || len(out.Languages) < len(offeredLanguages()) {
			t.Errorf("%d %+v", code, out)
		}
	})

	t.Run("events stream and replay from Last-Event-ID", func(t *testing.T) {
		var acc struct {
			RunID     string `json:"run_id"`
			Status    string `json:"status"`
			EventsURL string `json:"events_url"`
		}
		code := s.request("POST", "/v1/runs", map[string]any{"language": "bash",
			"code": "for i in 1 2 3 4 5; do echo line$i; sleep 0.2; done"}, &acc)
		if code != http.StatusAccepted || acc.Status != "queued" || acc.EventsURL == "" {
			t.Fatalf("%d %+v", code, acc)
		}
		all := readSSE(t, s.url+acc.EventsURL, "", 0)
		var types []string
		for i, ev := range all {
			types = append(types, ev.Type)
			if ev.Seq != int64(i+1) || ev.ID != fmt.Sprint(ev.Seq) {
				t.Errorf("event %d has seq %d id %s", i, ev.Seq, ev.ID)
			}
		}
		if types[0] != "queued" || types[1] != "started" || types[len(types)-2] != "exit" || types[len(types)-1] != "done" {
			t.Errorf("event types %v", types)
		}
		// A client that saw three events and reconnects gets the rest,
		// without gap or duplicate.
		rest := readSSE(t, s.url+acc.EventsURL, "3", 0)
		if len(rest) != len(all)-3 || rest[0].Seq != 4 {
			t.Fatalf("replay from 3: %d events starting at %d, want %d from 4", len(rest), rest[0].Seq, len(all)-3)
		}
		for i := range rest {
			if rest[i].Data != all[i+3].Data || rest[i].Seq != all[i+3].Seq {
				t.Errorf("replayed event %d differs", i)
			}
		}
	})

	t.Run("live stream disconnect and reconnect", func(t *testing.T) {
		var acc struct {
			RunID     string `json:"run_id"`
			EventsURL string `json:"events_url"`
		}
		s.request("POST", "/v1/runs", map[string]any{"language": "bash",
			"code": "for i in $(seq 1 8); do echo n$i; sleep 0.3; done"}, &acc)
		first := readSSE(t, s.url+acc.EventsURL, "", 3) // leaves after 3 events, while the run goes on
		rest := readSSE(t, s.url+acc.EventsURL, fmt.Sprint(first[len(first)-1].Seq), 0)
		var out strings.Builder
		seq := int64(0)
		for _, ev := range append(first, rest...) {
			if ev.Seq != seq+1 {
				t.Fatalf("seq %d after %d", ev.Seq, seq)
			}
			seq = ev.Seq
			if ev.Type == "stdout" {
				out.WriteString(ev.Data)
			}
		}
		want := ""
		for i := 1; i <= 8; i++ {
			want += fmt.Sprintf("n%d\n", i)
		}
		if out.String() != want {
			t.Errorf("output across reconnect %q", out.String())
		}
	})

	t.Run("bad input", func(t *testing.T) {
		cases := []struct {
			name   string
			body   any
			status int
			code   string
		}{
			{"bad JSON", `{"language": "python", "code": `, 400, "invalid_argument"},
			{"empty code", map[string]any{"language": "python", "code": ""}, 400, "invalid_argument"},
			{"unknown language", map[string]any{"language": "cobol", "code": "x"}, 400, "unknown_language"},
			{"bad conversationId", map[string]any{"language": "bash", "code": "x", "conversationId": "a/b"}, 400, "invalid_argument"},
			{"timeout out of range", map[string]any{"language": "bash", "code": "x", "timeout_seconds": 61}, 400, "invalid_argument"},
		}
		for _, c := range cases {
			var e toolError
			if status := s.request("POST", "/v1/runs", c.body, &e); status != c.status || e.Error != c.code {
				t.Errorf("%s: %d %+v, want %d %s", c.name, status, e, c.status, c.code)
			}
		}
		var e toolError
		if status := s.request("GET", "/v1/runs/run_000000000000000000000000", nil, &e); status != 404 || e.Error != "not_found" {
			t.Errorf("missing run: %d %+v", status, e)
		}
		resp, _ := http.Get(s.url + "/v1/runners")
		resp.Body.Close()
		if resp.StatusCode != http.StatusUnauthorized {
			t.Errorf("no token: %d", resp.StatusCode)
		}
	})

	t.Run("dashboard behind the token, with HTTP Basic for browsers", func(t *testing.T) {
		resp, _ := http.Get(s.url + "/monitoring/")
		resp.Body.Close()
		if resp.StatusCode != http.StatusUnauthorized || !strings.HasPrefix(resp.Header.Get("WWW-Authenticate"), "Basic") {
			t.Errorf("without a token: %d %q", resp.StatusCode, resp.Header.Get("WWW-Authenticate"))
		}
		req, _ := http.NewRequest("GET", s.url+"/monitoring/", nil)
		req.SetBasicAuth("anyone", token)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Errorf("with the token: %d", resp.StatusCode)
		}
		req, _ = http.NewRequest("GET", s.url+"/monitoring/api/queues", nil)
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err = http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Errorf("dashboard API: %d", resp.StatusCode)
		}
	})

	t.Run("health, readiness, metrics, playground", func(t *testing.T) {
		for path, want := range map[string]string{"/healthz": "ok", "/readyz": `"redis":"ok"`, "/metrics": "go_goroutines", "/": "<title>runbox playground"} {
			code, body := get(t, s.url+path)
			if code != http.StatusOK || !strings.Contains(string(body), want) {
				t.Errorf("%s: %d %.200q", path, code, body)
			}
		}
	})
}

type sseEvent struct {
	ID   string
	Seq  int64  `json:"seq"`
	Type string `json:"type"`
	Data string `json:"data"`
}

// readSSE reads an event stream from lastID on, until done or until it
// has read limit events (0: no limit).
func readSSE(t *testing.T, url, lastID string, limit int) []sseEvent {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, "GET", url, nil)
	req.Header.Set("Authorization", "Bearer "+token)
	if lastID != "" {
		req.Header.Set("Last-Event-ID", lastID)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Type") != "text/event-stream" {
		t.Fatalf("events: %d %s", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	var evs []sseEvent
	var cur sseEvent
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		switch {
		case strings.HasPrefix(line, "id: "):
			cur.ID = strings.TrimPrefix(line, "id: ")
		case strings.HasPrefix(line, "data: "):
			id := cur.ID
			if err := json.Unmarshal([]byte(strings.TrimPrefix(line, "data: ")), &cur); err != nil {
				t.Fatal(err)
			}
			cur.ID = id
		case line == "" && cur.ID != "":
			evs = append(evs, cur)
			if cur.Type == "done" || (limit > 0 && len(evs) == limit) {
				return evs
			}
			cur = sseEvent{}
		}
	}
	t.Fatalf("stream ended before done after %d events", len(evs))
	return nil
}

// TestExecutorCrash kills an executor with SIGKILL mid-run: the waiting
// client gets error and done within 15 s, and the run never runs again.
func TestExecutorCrash(t *testing.T) {
	s := start(t, options{})
	// A second executor stays up: it must not pick the lost run up again.
	s.startExecutor()
	cs := s.session(nil)

	type outcome struct {
		r   result
		err error
	}
	got := make(chan outcome, 1)
	go func() {
		res, err := cs.CallTool(context.Background(), &mcp.CallToolParams{Name: "run_code", Arguments: map[string]any{
			"language": "bash", "conversationId": "crash",
			"code": "echo started-once >> /data/marks; cat /etc/hostname; echo up; sleep 50"}})
		var r result
		if err == nil {
			b, _ := json.Marshal(res.StructuredContent)
			err = json.Unmarshal(b, &r)
		}
		got <- outcome{r, err}
	}()

	// Once the program runs and its output so far has reached the
	// service (what the client must get back is known), find the executor
	// whose sandbox runs it, and kill it.
	var host, before string
	cs2 := s.session(nil)
	waitFor(t, func() bool {
		var runs struct {
			Runs []struct {
				RunID string `json:"run_id"`
			} `json:"runs"`
		}
		call(t, cs2, "list_runs", map[string]any{"conversationId": "crash"}, &runs)
		if len(runs.Runs) == 0 {
			return false
		}
		var p progress
		call(t, cs2, "get_run", map[string]any{"run_id": runs.Runs[0].RunID}, &p)
		before = stdoutOf(p.Events)
		var ok bool
		host, ok = strings.CutSuffix(before, "\nup\n")
		return ok
	})
	victimID := s.containerExecutor(host)
	var victim *proc
	for _, p := range s.procs {
		if p.name == "executor "+victimID {
			victim = p
		}
	}
	orphans := s.containerIDs(victimID)
	killedAt := time.Now()
	if err := victim.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	select {
	case o := <-got:
		if o.err != nil {
			t.Fatal(o.err)
		}
		if d := time.Since(killedAt); d > 15*time.Second {
			t.Errorf("the client learned of the crash after %v", d)
		}
		if o.r.Success || o.r.Error == "" || o.r.Stdout != before {
			t.Errorf("result %+v: want an error that keeps the output so far", o.r)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the client was left hanging")
	}
	// Long enough for any recovery to have re-run it.
	time.Sleep(3 * time.Second)
	if marks := crashMarks(t, s); marks != "started-once\n" {
		t.Errorf("the program ran %d times", strings.Count(marks, "started-once"))
	}
	// The dead executor's containers (the run's, its pool) are orphans; a
	// restart with its id reaps them — unless the live executor's peers'
	// reaper, which removes a dead executor's sandboxes about ten seconds
	// after its heartbeat ends, got there first (under gVisor the steps
	// above take that long).
	if !orphans[host] {
		t.Fatalf("the run's container %s is not among the victim's %v", host, orphans)
	}
	p := s.spawn("executor "+victimID+" (restarted)", bin.executor, "EXECUTOR_ID="+victimID)
	waitFor(t, func() bool { return strings.Contains(p.out.String(), "executor started") })
	for id := range orphans {
		if s.containerExists(id) {
			t.Errorf("orphan %s survived the restart", id)
		}
	}
	reaped := strings.Contains(p.out.String(), "removed orphaned sandboxes")
	for _, q := range s.procs {
		for line := range strings.Lines(q.out.String()) {
			reaped = reaped || strings.Contains(line, "removed the sandboxes of a dead executor") &&
				strings.Contains(line, "peer="+victimID)
		}
	}
	if !reaped {
		t.Error("neither the restarted executor nor a live one reported reaping the dead one's sandboxes")
	}
}

// crashMarks returns the marks TestExecutorCrash's program left in /data:
// in the conversation's folder, which a container mounts; a pod's /data
// reaches the executor's folder only after a run, so on Kubernetes they
// are read in the sandbox pods (the run cut short's, which its dead
// executor left, and any that ran it again).
func crashMarks(t *testing.T, s *service) string {
	if onKubernetes {
		k := testCluster(t)
		return k.pods.readAll(t, k.cluster, "/data/marks")
	}
	marks, _ := os.ReadFile(s.root + "/crash/files/marks")
	return string(marks)
}

// TestExecutorShutdown sends SIGTERM to an executor with a running program
// that outlives the grace period: the run ends as an error within the
// grace, no container is left, and the program does not run again.
func TestExecutorShutdown(t *testing.T) {
	s := start(t, options{executors: 1, env: []string{"EXECUTOR_SHUTDOWN_GRACE=2s"}})
	var acc struct {
		RunID string `json:"run_id"`
	}
	s.request("POST", "/v1/runs", map[string]any{"language": "bash", "conversationId": "shut",
		"code": "echo once >> marks; echo up; sleep 60"}, &acc)
	ex := s.procs[0]
	// The program is running (not only claimed: its sandbox may still be
	// starting), and its "up" has had time to reach the executor.
	waitFor(t, func() bool {
		marks, _ := os.ReadFile(s.root + "/shut/files/marks")
		return string(marks) == "once\n"
	})
	time.Sleep(500 * time.Millisecond)
	sent := time.Now()
	ex.cmd.Process.Signal(os.Interrupt)
	select {
	case <-ex.done:
	case <-time.After(30 * time.Second):
		t.Fatal("executor did not stop")
	}
	if d := time.Since(sent); d > 10*time.Second {
		t.Errorf("shutdown took %v with a 2s grace", d)
	}
	var run struct {
		Status string  `json:"status"`
		Result *result `json:"result"`
	}
	s.request("GET", "/v1/runs/"+acc.RunID, nil, &run)
	if run.Status != "error" || run.Result == nil || !strings.Contains(run.Result.Error, "shut down") || run.Result.Stdout != "up\n" {
		t.Errorf("run after shutdown: %+v %+v", run, run.Result)
	}
	if n := s.containers(s.executors[0]); n != 0 {
		t.Errorf("%d containers left", n)
	}
	// A new executor must not run it again.
	s.startExecutor()
	time.Sleep(3 * time.Second)
	if marks, _ := os.ReadFile(s.root + "/shut/files/marks"); string(marks) != "once\n" {
		t.Errorf("marks %q: the program ran again", marks)
	}
}

// TestEmbedded runs the service as `make run` does: api alone, with Redis
// and an executor inside it.
func TestEmbedded(t *testing.T) {
	s := start(t, options{embedded: true})
	cs := s.session(nil)
	r := runCode(t, cs, map[string]any{"language": "python", "code": "print('embedded')"})
	if r.Stdout != "embedded\n" {
		t.Errorf("result %+v", r)
	}
	code, body := get(t, s.url+"/readyz")
	if code != 200 || !strings.Contains(string(body), `"docker":"ok"`) {
		t.Errorf("readyz %d %s", code, body)
	}
	// The embedded executor reports through api's /metrics. The run was
	// taken when announced; asynq's view of its task (the dashboard, the
	// queue gauge) catches up at asynq's next poll, within 1.5 s.
	wants := []string{
		`runbox_runs_finished_total{language="python",status="succeeded"} 1`,
		`runbox_sandboxes_warm 1`,
		`runbox_queue_pending 0`,
		`runbox_http_requests_total{code="200",route="/mcp"}`,
	}
	var missing []string
	for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		_, body = get(t, s.url+"/metrics")
		missing = missing[:0]
		for _, want := range wants {
			if !strings.Contains(string(body), want) {
				missing = append(missing, want)
			}
		}
		if len(missing) == 0 || time.Now().After(deadline) {
			break
		}
	}
	for _, want := range missing {
		t.Errorf("/metrics lacks %s", want)
	}
}

// TestConfigErrors: a bad setting stops the process at start with one
// clear line.
func TestConfigErrors(t *testing.T) {
	cases := []struct {
		bin  string
		env  []string
		want string
	}{
		{bin.api, []string{"SANDBOX_MEMORY_LIMIT=lots"}, "SANDBOX_MEMORY_LIMIT"},
		{bin.api, []string{"SANDBOX_EXEC_TIMEOUT=soon"}, "SANDBOX_EXEC_TIMEOUT"},
		{bin.api, []string{"MCP_API_TOKENS=nocolon"}, "MCP_API_TOKENS"},
		// A part's own setting (app.Load has the part read it), in either
		// process, before Redis is reached.
		{bin.api, []string{"SANDBOX_EGRESS_HOSTS=pypi.internal"}, "SANDBOX_EGRESS_HOSTS"},
		{bin.executor, []string{"REDIS_URL=redis://127.0.0.1:1/0", "CLIENTS_FILE=/nonexistent/clients.yaml"}, "CLIENTS_FILE"},
		{bin.api, []string{"REDIS_URL=redis://127.0.0.1:1/0"}, "not reachable"},
		{bin.executor, nil, "REDIS_URL is required"},
		// A misspelt limit never leaves the limit off.
		{bin.api, []string{"SANDBOX_MEMORY_LIMT=1g"}, "did you mean SANDBOX_MEMORY_LIMIT"},
		{bin.api, []string{"SANDBOX_MAX_PER_SESION=2"}, "did you mean SANDBOX_MAX_PER_SESSION"},
		{bin.api, []string{"SANDBOX_EXEC_TIMEOUT_S=5", "SANDBOX_EXEC_TIMEOUT=5s"}, "the same setting"},
	}
	for _, c := range cases {
		cmd := exec.Command(c.bin)
		cmd.Env = append(os.Environ(), "SANDBOX_ROOT="+t.TempDir())
		cmd.Env = append(cmd.Env, c.env...)
		out, err := cmd.CombinedOutput()
		lines := strings.Split(strings.TrimSpace(string(out)), "\n")
		if err == nil || len(lines) != 1 || !strings.Contains(lines[0], c.want) {
			t.Errorf("%v: err %v, output %q: want one line naming %s", c.env, err, out, c.want)
		}
	}
}

// TestExecutorShutdownLetsRunsFinish: a program that ends within the grace
// period finishes normally when its executor is asked to stop.
func TestExecutorShutdownLetsRunsFinish(t *testing.T) {
	s := start(t, options{env: []string{"EXECUTOR_SHUTDOWN_GRACE=20s"}})
	var acc struct {
		RunID string `json:"run_id"`
	}
	s.request("POST", "/v1/runs", map[string]any{"language": "bash", "code": "echo up; sleep 2; echo finished"}, &acc)
	ex := s.procs[0]
	waitFor(t, func() bool { return strings.Contains(ex.out.String(), "run started") })
	ex.cmd.Process.Signal(os.Interrupt)
	select {
	case <-ex.done:
	case <-time.After(30 * time.Second):
		t.Fatal("executor did not stop")
	}
	var run struct {
		Status string  `json:"status"`
		Result *result `json:"result"`
	}
	s.request("GET", "/v1/runs/"+acc.RunID, nil, &run)
	if run.Status != "succeeded" || run.Result.Stdout != "up\nfinished\n" {
		t.Errorf("run %+v %+v", run, run.Result)
	}
}

// TestPoolForNewConversations: a new conversation's first run goes to a
// sandbox started before it was asked for, and the pool fills up again.
func TestPoolForNewConversations(t *testing.T) {
	s := start(t, options{env: []string{"SANDBOX_POOL=0,python=2"}})
	cs := s.session(nil)
	ex := s.executors[0]
	waitFor(t, func() bool { return len(s.containerIDs(ex)) == 2 })
	pooled := s.containerIDs(ex)
	r := runCode(t, cs, map[string]any{"language": "python", "code": "print(open('/etc/hostname').read().strip())\nopen('mine.txt', 'w').write('x')"})
	host := strings.TrimSpace(r.Stdout)
	if !pooled[host] {
		t.Errorf("the first run went to %s, not to a pre-started sandbox of %v", host, pooled)
	}
	if len(r.Files) != 1 || r.Files[0].Name != "mine.txt" {
		t.Errorf("files %+v: the adopted sandbox must write to the conversation's folder", r.Files)
	}
	// The next run of the conversation uses the same sandbox; the pool is
	// refilled beside it.
	r2 := runCode(t, cs, map[string]any{"language": "python", "conversationId": r.ConversationID,
		"code": "print(open('/etc/hostname').read().strip())"})
	if strings.TrimSpace(r2.Stdout) != host {
		t.Errorf("the second run went to %s", r2.Stdout)
	}
	waitFor(t, func() bool { return len(s.containerIDs(ex)) == 3 })
}

// waitJoined waits up to 5 s for the messages got collects (under mu) to
// join to want, and returns what they join to: the SDK's client hands
// notifications to their handler on a goroutine of its own, so the last
// may reach it just after the call's result.
func waitJoined(mu *sync.Mutex, got *[]string, want string) string {
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		mu.Lock()
		joined := strings.Join(*got, "")
		mu.Unlock()
		if joined == want || time.Now().After(deadline) {
			return joined
		}
	}
}

// wireTap records, in the order the client reads them off the wire, the
// messages of the event streams its transport carries: each progress
// notification's message (heartbeats, which carry none, left out) and
// "result" for a response.
type wireTap struct {
	mu   sync.Mutex
	seen []string
}

func (w *wireTap) wrap(next http.RoundTripper) http.RoundTripper {
	return roundTripper(func(r *http.Request) (*http.Response, error) {
		resp, err := next.RoundTrip(r)
		if err == nil && strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
			pr, pw := io.Pipe()
			body := resp.Body
			resp.Body = pr
			go func() {
				// Each line is recorded before the client can read it.
				defer body.Close()
				sc := bufio.NewScanner(body)
				sc.Buffer(nil, 1<<20)
				for sc.Scan() {
					w.line(sc.Text())
					if _, err := pw.Write(append(sc.Bytes(), '\n')); err != nil {
						return
					}
				}
				pw.CloseWithError(sc.Err())
			}()
		}
		return resp, err
	})
}

func (w *wireTap) line(line string) {
	data, ok := strings.CutPrefix(line, "data:")
	if !ok {
		return
	}
	var msg struct {
		ID     any    `json:"id"`
		Method string `json:"method"`
		Params struct {
			Message string `json:"message"`
		} `json:"params"`
	}
	if json.Unmarshal([]byte(data), &msg) != nil {
		return
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	switch {
	case msg.Method == "" && msg.ID != nil:
		w.seen = append(w.seen, "result")
	case msg.Method == "notifications/progress" && msg.Params.Message != "":
		w.seen = append(w.seen, msg.Params.Message)
	}
}

func (w *wireTap) messages() []string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return slices.Clone(w.seen)
}

type roundTripper func(*http.Request) (*http.Response, error)

func (f roundTripper) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }
