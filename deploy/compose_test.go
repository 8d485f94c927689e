// Package deploy_test brings docker-compose.yml up on this machine's Docker
// Engine and uses it as a client would: code through /mcp, a download, an
// executor killed, Redis restarted, and the stack taken down right after
// another executor was killed, with no sandbox left.
package deploy_test

import (
	"cmp"
	"context"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/moby/moby/client"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/runbox-dev/runbox/internal/bench"
	"github.com/runbox-dev/runbox/internal/sandbox"
	"github.com/runbox-dev/runbox/internal/sandbox/docker/dockertest"
	"github.com/runbox-dev/runbox/internal/testenv"
)

const token = "compose-test-token-0123"

// stack is a compose project brought up for one test.
type stack struct {
	t       *testing.T
	compose []string // the command: docker-compose (v1) or docker compose (v2)
	env     []string
	url     string
	docker  *client.Client
}

func TestCompose(t *testing.T) {
	s := up(t, 3)
	ctx := context.Background()
	cs := s.connect()

	// Code through /mcp, and a download of the file it wrote.
	res := runCode(t, cs, map[string]any{"language": "python", "conversationId": "deploy",
		"code": "open('/data/hello.txt', 'w').write('hello from compose')\nprint('ran')"})
	if !res.Success || strings.TrimSpace(res.Stdout) != "ran" || len(res.Files) != 1 {
		t.Fatalf("first run: %+v", res)
	}
	if body := download(t, res.Files[0].URL); body != "hello from compose" {
		t.Errorf("download = %q", body)
	}
	first := res.RunID

	// A server previewed: the api reaches its sandbox through the link of
	// the executor that holds it.
	if _, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "run_code", Arguments: map[string]any{
		"language": "python", "conversationId": "web", "background": true, "code": bench.PythonPageServer(1 << 10)}}); err != nil {
		t.Fatal(err)
	}
	var preview struct {
		URL string `json:"url"`
	}
	waitFor(t, 60*time.Second, "a preview URL", func() bool {
		r, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "get_preview_url", Arguments: map[string]any{"conversationId": "web", "port": 8000}})
		if err != nil || r.IsError {
			return false
		}
		b, _ := json.Marshal(r.StructuredContent)
		return json.Unmarshal(b, &preview) == nil && preview.URL != ""
	})
	if code, body := previewGet(t, strings.TrimPrefix(s.url, "http://"), preview.URL); code != http.StatusOK || !strings.Contains(body, "python preview") {
		t.Errorf("preview %s: %d %q", preview.URL, code, body)
	}

	// One executor killed: the others still run code, and the dead one's
	// sandboxes go within 60 s of its heartbeat's end (10 s after the kill).
	executors := s.containers("executor")
	if len(executors) != 3 {
		t.Fatalf("executors: %v", executors)
	}
	killed := executors[0]
	if _, err := s.docker.ContainerKill(ctx, killed, client.ContainerKillOptions{Signal: "KILL"}); err != nil {
		t.Fatal(err)
	}
	for i := range 4 {
		res := runCode(t, cs, map[string]any{"language": "bash", "conversationId": fmt.Sprintf("after-kill-%d", i),
			"code": "echo alive"})
		if !res.Success || strings.TrimSpace(res.Stdout) != "alive" {
			t.Fatalf("run after the kill: %+v", res)
		}
	}
	waitFor(t, 70*time.Second, "the killed executor's sandboxes to be removed", func() bool {
		return s.sandboxes(killed[:12]) == 0
	})

	// Redis restarted: an earlier run is still there (AOF, fsync every
	// second), and the stack goes on taking runs.
	time.Sleep(1500 * time.Millisecond) // past the AOF's fsync interval
	for _, id := range s.containers("redis") {
		if _, err := s.docker.ContainerRestart(ctx, id, client.ContainerRestartOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, 60*time.Second, "the earlier run after the Redis restart", func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		r, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "get_run", Arguments: map[string]any{"run_id": first}})
		return err == nil && !r.IsError
	})
	res = runCode(t, cs, map[string]any{"language": "python", "conversationId": "deploy",
		"code": "print(open('/data/hello.txt').read())"})
	if !res.Success || strings.TrimSpace(res.Stdout) != "hello from compose" {
		t.Fatalf("run after the Redis restart: %+v", res)
	}

	// Down right after another executor was killed, its heartbeat still
	// current: the last one standing removes its sandboxes on its way out,
	// and no sandbox of any executor is left.
	live := s.containers("executor")
	if len(live) != 2 {
		t.Fatalf("live executors: %v", live)
	}
	waitFor(t, 60*time.Second, "the next victim's pool", func() bool { return s.sandboxes(live[0][:12]) > 0 })
	if _, err := s.docker.ContainerKill(ctx, live[0], client.ContainerKillOptions{Signal: "KILL"}); err != nil {
		t.Fatal(err)
	}
	s.run("down", "-v", "--timeout", "60")
	for _, id := range append(live, killed) {
		if n := s.sandboxes(id[:12]); n != 0 {
			t.Errorf("executor %s left %d sandboxes after down", id[:12], n)
		}
	}
}

// up builds the images (by content hash: a no-op when they are current)
// and brings the stack up with n executors.
func up(t *testing.T, executors int) *stack {
	t.Helper()
	build := exec.Command("./build.sh")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		t.Fatalf("deploy/build.sh: %v", err)
	}
	port := testenv.FreePort(t)
	project := "runboxtest" + strings.ToLower(rand.Text()[:8])
	data := t.TempDir()
	s := &stack{
		t:       t,
		compose: composeCommand(t),
		url:     fmt.Sprintf("http://127.0.0.1:%d", port),
		docker:  dockertest.Client(t),
		env: append(os.Environ(),
			"COMPOSE_PROJECT_NAME="+project,
			"COMPOSE_FILE="+filepath.Join("..", "docker-compose.yml"),
			"MCP_API_TOKEN="+token,
			fmt.Sprintf("RUNBOX_PORT=%d", port),
			"RUNBOX_DATA="+data,
			"RUNNER_TAG="+cmp.Or(os.Getenv("RUNNER_TAG"), "latest"),
		),
	}
	t.Cleanup(func() {
		if t.Failed() {
			s.run("logs", "--tail", "50")
		}
		s.run("down", "-v", "--timeout", "60")
		// Sandboxes write their files as the sandbox user; the temp dir's
		// removal needs them writable.
		exec.Command("chmod", "-R", "u+rwX", data).Run()
	})
	s.run("up", "-d", "--scale", fmt.Sprintf("executor=%d", executors))
	waitFor(t, 60*time.Second, "the api to be ready", func() bool {
		resp, err := http.Get(s.url + "/readyz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	return s
}

// composeCommand is the v2 plugin when the engine has it, else Debian's
// docker-compose 1.x.
func composeCommand(t *testing.T) []string {
	if exec.Command("docker", "compose", "version").Run() == nil {
		return []string{"docker", "compose"}
	}
	if path, err := exec.LookPath("docker-compose"); err == nil {
		return []string{path}
	}
	t.Fatal("neither `docker compose` nor docker-compose is installed (apt-get install docker-compose)")
	return nil
}

func (s *stack) run(args ...string) {
	s.t.Helper()
	cmd := exec.Command(s.compose[0], append(s.compose[1:], args...)...)
	cmd.Env = s.env
	out, err := cmd.CombinedOutput()
	if err != nil {
		s.t.Fatalf("%s %s: %v\n%s", strings.Join(s.compose, " "), strings.Join(args, " "), err, out)
	}
	if args[0] == "logs" {
		s.t.Logf("%s", out)
	}
}

// containers returns the ids of the running containers of a service.
func (s *stack) containers(service string) []string {
	s.t.Helper()
	project := ""
	for _, e := range s.env {
		if v, ok := strings.CutPrefix(e, "COMPOSE_PROJECT_NAME="); ok {
			project = v
		}
	}
	res, err := s.docker.ContainerList(context.Background(), client.ContainerListOptions{
		Filters: client.Filters{}.Add("label", "com.docker.compose.project="+project, "com.docker.compose.service="+service),
	})
	if err != nil {
		s.t.Fatal(err)
	}
	ids := make([]string, 0, len(res.Items))
	for _, c := range res.Items {
		ids = append(ids, c.ID)
	}
	return ids
}

// sandboxes counts the containers an executor (named by its hostname, the
// short container id) started.
func (s *stack) sandboxes(executor string) int {
	s.t.Helper()
	res, err := s.docker.ContainerList(context.Background(), client.ContainerListOptions{
		All:     true,
		Filters: client.Filters{}.Add("label", sandbox.LabelManaged+"=true", sandbox.LabelExecutor+"="+executor),
	})
	if err != nil {
		s.t.Fatal(err)
	}
	return len(res.Items)
}

func (s *stack) connect() *mcp.ClientSession {
	s.t.Helper()
	return testenv.Session(s.t, s.url+"/mcp", token, nil)
}

type result struct {
	Success bool   `json:"success"`
	Stdout  string `json:"stdout"`
	Stderr  string `json:"stderr"`
	RunID   string `json:"run_id"`
	Error   string `json:"error"`
	Files   []struct {
		Name string `json:"name"`
		URL  string `json:"url"`
	} `json:"files"`
}

func runCode(t *testing.T, cs *mcp.ClientSession, args map[string]any) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "run_code", Arguments: args})
	if err != nil {
		t.Fatalf("run_code: %v", err)
	}
	var r result
	b, _ := json.Marshal(res.StructuredContent)
	if err := json.Unmarshal(b, &r); err != nil {
		t.Fatalf("run_code: decode %s: %v", b, err)
	}
	return r
}

func download(t *testing.T, url string) string {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %d %s", url, resp.StatusCode, body)
	}
	return string(body)
}

func waitFor(t *testing.T, limit time.Duration, what string, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(limit)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(250 * time.Millisecond)
	}
}

// previewGet GETs a preview URL through the api's published port (a
// browser resolves <capability>.localhost to the loopback).
func previewGet(t *testing.T, api, url string) (int, string) {
	t.Helper()
	resp, err := bench.Via(api).Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}
