package e2e

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/redis/go-redis/v9"

	"github.com/runbox-dev/runbox/internal/testenv"
)

// TestErrorsLeakNothing calls every tool and route with bad input, then
// with Redis gone, then with the Docker Engine refusing every sandbox,
// and checks that no error a client sees carries a host path, a token, a
// secret, or the words of a Redis or Docker error.
func TestErrorsLeakNothing(t *testing.T) {
	s := start(t, options{env: []string{"MCP_API_TOKENS=alice:" + aliceToken}})
	opt, _ := redis.ParseURL(s.redisURL)
	secrets := []string{token, aliceToken, s.secret, s.root, opt.Addr, bin.dir, "redis://", "docker.sock",
		"/var/lib/docker", "dial tcp", "goroutine", "runtime error", "moby", "ERR "}
	check := func(where, msg string) {
		t.Helper()
		for _, s := range secrets {
			if s != "" && strings.Contains(msg, s) {
				t.Errorf("%s: error shows %q: %s", where, s, msg)
			}
		}
	}
	cs := s.session(nil)
	alice := s.sessionAs(aliceToken)
	// A run and a file, so that later calls name things that exist.
	res := runCode(t, cs, map[string]any{"language": "bash", "conversationId": "leak", "code": "echo x > /data/f.txt"})
	runID := res.RunID

	argSets := []map[string]any{
		{},
		{"run_id": "run_000000000000000000000000"},
		{"run_id": runID, "after_seq": -1, "wait_seconds": 1000},
		{"run_id": "../../etc/passwd"},
		{"conversationId": "../../etc"},
		{"conversationId": "leak", "path": "../../../etc/passwd"},
		{"conversationId": "leak", "path": "/data/../../etc/passwd", "name": "f.txt/../../x"},
		{"conversationId": "leak", "filename": "../x", "content_base64": "!!"},
		{"conversationId": "~alice~leak", "path": "f.txt"},
		{"language": "cobol", "code": "x"},
		{"language": "python", "code": strings.Repeat("x", 200000)},
		{"language": "bash", "code": "true", "timeout_seconds": 100000, "env": map[string]any{"RUNBOX_X": "1"}},
		{"run_id": runID, "data": "x"},
		{"session_id": "nope-" + strings.Repeat("z", 80)},
	}
	callAll := func(phase string, cs *mcp.ClientSession) {
		t.Helper()
		tools, err := cs.ListTools(context.Background(), nil)
		if err != nil {
			check(phase+" tools/list", err.Error())
			return
		}
		names := []string{"run_python", "read_artifact", "list_artifacts", "sandbox.run_code", "sandbox.list_runners"}
		for _, tool := range tools.Tools {
			names = append(names, tool.Name)
		}
		for _, name := range names {
			for _, args := range argSets {
				ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
				r, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: name, Arguments: args})
				cancel()
				if err != nil {
					check(phase+" "+name, err.Error())
					continue
				}
				if r.IsError {
					check(phase+" "+name, text(r))
				}
			}
		}
	}
	routes := []struct{ method, path, body string }{
		{"GET", "/v1/runs/run_000000000000000000000000", ""},
		{"GET", "/v1/runs/" + runID + "/events", ""},
		{"POST", "/v1/runs", `{"language":"cobol","code":"x"}`},
		{"POST", "/v1/runs", `{"language":"bash"`},
		{"POST", "/v1/runs?wait=true", `{"language":"bash","code":"true","conversationId":"../x"}`},
		{"DELETE", "/v1/runs/" + runID, ""},
		{"POST", "/v1/runs/" + runID + "/stdin", `{"data":"x"}`},
		{"GET", "/v1/runs", ""},
		{"GET", "/v1/runners", ""},
		{"GET", "/v1/conversations/leak/files", ""},
		{"GET", "/v1/conversations/leak/files/..%2f..%2fetc%2fpasswd", ""},
		{"GET", "/v1/conversations/leak/files/nope.txt", ""},
		{"PUT", "/v1/conversations/leak/files/..%2fx", "x"},
		{"PUT", "/v1/conversations/..%2f..%2ftmp/files/x", "x"},
		{"DELETE", "/v1/conversations/~alice~leak", ""},
		{"GET", "/files/leak/f.txt?exp=1&sig=00", ""},
		{"GET", "/files/~alice/leak/f.txt?exp=9999999999&sig=00", ""},
		{"GET", "/files/..%2f..%2fetc/passwd?exp=9999999999&sig=00", ""},
		{"GET", "/monitoring/api/queues", ""},
		{"GET", "/readyz", ""},
		{"POST", "/mcp", `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"get_run","arguments":{"run_id":"x"}}}`},
	}
	restAll := func(phase string) {
		t.Helper()
		for _, tok := range []string{token, aliceToken, "wrong-token-000000", ""} {
			for _, r := range routes {
				req, _ := http.NewRequest(r.method, s.url+r.path, strings.NewReader(r.body))
				if tok != "" {
					req.Header.Set("Authorization", "Bearer "+tok)
				}
				req.Header.Set("Content-Type", "application/json")
				req.Header.Set("Accept", "application/json, text/event-stream")
				ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
				resp, err := http.DefaultClient.Do(req.WithContext(ctx))
				if err != nil {
					cancel()
					continue
				}
				body, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
				resp.Body.Close()
				cancel()
				if resp.StatusCode >= 400 || strings.Contains(string(body), `"error"`) {
					check(phase+" "+r.method+" "+r.path, string(body)+" "+resp.Header.Get("WWW-Authenticate"))
				}
			}
		}
	}

	callAll("bad input", cs)
	callAll("bad input (alice)", alice)
	restAll("bad input")

	// Redis gone: every call fails, and says nothing of why.
	rdb := redis.NewClient(opt)
	rdb.Do(context.Background(), "SHUTDOWN", "NOSAVE")
	rdb.Close()
	callAll("redis down", cs)
	restAll("redis down")
}

// TestDockerErrorsLeakNothing: a Docker Engine that refuses every sandbox
// (more CPUs than the host has) fails the run with a message of ours.
func TestDockerErrorsLeakNothing(t *testing.T) {
	cpus := fmt.Sprint(runtime.NumCPU() * 4)
	s := start(t, options{env: []string{"SANDBOX_CPU_LIMIT=" + cpus, "SANDBOX_POOL=0"}})
	cs := s.session(nil)
	r := call(t, cs, "run_code", map[string]any{"language": "bash", "code": "echo hi"}, nil)
	msg := text(r)
	var res result
	_ = jsonUnmarshal(msg, &res)
	if res.Success || (res.Error == "" && !r.IsError) {
		t.Fatalf("a run without a sandbox succeeded: %s", msg)
	}
	for _, bad := range []string{"cpu", "docker", "Error response", s.root} {
		if strings.Contains(strings.ToLower(msg), strings.ToLower(bad)) {
			t.Errorf("run error shows %q: %s", bad, msg)
		}
	}
}

// TestUnknownRuntime: an executor whose SANDBOX_RUNTIME the Docker Engine
// does not know stops at start with one line that says so.
func TestUnknownRuntime(t *testing.T) {
	cmd := exec.Command(bin.executor)
	cmd.Env = append(os.Environ(), "SANDBOX_ROOT="+t.TempDir(), "REDIS_URL="+testenv.Redis(t),
		"SANDBOX_RUNTIME=no-such-runtime", "LOG_LEVEL=error")
	out, err := cmd.CombinedOutput()
	lines := strings.Split(strings.TrimSpace(string(out)), "\n")
	if err == nil || len(lines) != 1 || !strings.Contains(lines[0], `no runtime "no-such-runtime"`) {
		t.Errorf("err %v, output %q: want one line naming the runtime", err, out)
	}
}

// TestRunnerListErrors: an executor on Kubernetes without a runner list,
// or with a list it cannot trust, stops at start with one line that says
// so, before it reaches any cluster.
func TestRunnerListErrors(t *testing.T) {
	redisURL := testenv.Redis(t)
	bad := testenv.WriteFile(t, "runners.json",
		`{"runners": [{"image": "runner-python:latest; rm -rf /", "labels": {"sandbox.runner": "true", "sandbox.language": "python"}}]}`)
	for _, c := range []struct{ file, want string }{
		{"", "needs SANDBOX_RUNNERS_FILE"},
		{bad, "runner list " + bad + ": runner 1: image"},
		{bad + ".missing", "runner list: open"},
	} {
		cmd := exec.Command(bin.executor)
		cmd.Env = append(os.Environ(), "SANDBOX_ROOT="+t.TempDir(), "REDIS_URL="+redisURL, "LOG_LEVEL=error",
			"SANDBOX_ENGINE=kubernetes", "KUBECONFIG=/nonexistent", "SANDBOX_RUNNERS_FILE="+c.file)
		out, err := cmd.CombinedOutput()
		lines := strings.Split(strings.TrimSpace(string(out)), "\n")
		if err == nil || len(lines) != 1 || !strings.Contains(lines[0], c.want) {
			t.Errorf("file %q: err %v, output %q: want one line with %q", c.file, err, out, c.want)
		}
	}
}
