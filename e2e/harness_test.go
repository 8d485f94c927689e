// Package e2e tests the service end to end: the real api and executor
// binaries, a real redis-server and the real Docker Engine, driven through
// the official MCP Go SDK client, the REST API and signed downloads.
package e2e

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/runbox-dev/runbox/internal/s3store"
	"github.com/runbox-dev/runbox/internal/testenv"
)

var bin struct {
	dir           string
	api, executor string
}

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "runbox-e2e-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	bin.dir = dir
	bin.api, bin.executor = filepath.Join(dir, "api"), filepath.Join(dir, "executor")
	// Tests run the binaries with the race detector; benchmarks without
	// it, which would otherwise be most of what they measure.
	flag.Parse()
	build := []string{"build", "-race"}
	if flag.Lookup("test.bench").Value.String() != "" {
		build = build[:1]
	}
	for out, pkg := range map[string]string{bin.api: "./cmd/api", bin.executor: "./cmd/executor"} {
		cmd := exec.Command("go", append(build, "-o", out, pkg)...)
		cmd.Dir = ".."
		cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
		if err := cmd.Run(); err != nil {
			fmt.Fprintln(os.Stderr, "build", pkg, err)
			os.Exit(1)
		}
	}
	// The test cluster, if a test or benchmark started it, stops after them.
	code := testenv.KubernetesMain(m)
	os.RemoveAll(dir)
	os.Exit(code)
}

const token = "e2e-token-0123456789"

// service is a running deployment: redis-server, api and executors.
type service struct {
	t        testing.TB
	url      string // http://127.0.0.1:port
	redisURL string
	// redis is the service's redis-server (none when embedded).
	redis  *testenv.RedisServer
	root   string
	secret string
	env    []string
	// sandboxes are those of the executors' engine.
	sandboxes sandboxes

	// s3 is the remote file store, when the service uses one; each
	// executor then has a SANDBOX_ROOT of its own under rootsDir, in roots.
	s3       *s3store.Options
	rootsDir string
	roots    map[string]string // by executor id

	mu        sync.Mutex
	procs     []*proc
	executors []string // ids
}

// proc is a process of the service, with its output kept for failures.
type proc struct {
	name string
	cmd  *exec.Cmd
	out  *syncBuffer
	done chan struct{}
}

type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

type options struct {
	env       []string // extra settings for every process
	executors int      // standalone executors to start (default 1)
	embedded  bool     // no REDIS_URL: api embeds Redis and an executor
	// s3 keeps files in a real S3 server (FILE_STORE): executors share
	// only Redis and the store, and the link secret is the one in Redis.
	s3 bool
	// engine runs the sandboxes on "docker" or "kubernetes"; empty, on
	// the pass's engine (E2E_ENGINE).
	engine string
	// redisArgs are added to redis-server's command line.
	redisArgs []string
}

func start(t testing.TB, o options) *service {
	t.Helper()
	port := testenv.FreePort(t)
	sandboxes, engineEnv := engineFor(t, o.engine)
	s := &service{
		t:         t,
		url:       fmt.Sprintf("http://127.0.0.1:%d", port),
		root:      t.TempDir(),
		secret:    "e2e-file-secret-" + rand.Text(),
		sandboxes: sandboxes,
	}
	s.env = append(append(os.Environ(), engineEnv...),
		"MCP_HTTP_ADDR=127.0.0.1:"+fmt.Sprint(port),
		"MCP_API_TOKEN="+token,
		"SANDBOX_ROOT="+s.root,
		"FILE_SECRET="+s.secret,
		"PUBLIC_BASE_URL="+s.url,
		"LOG_LEVEL=debug",
	)
	if !o.embedded {
		s.redis = testenv.StartRedis(t, o.redisArgs...)
		s.redisURL = s.redis.URL
		s.env = append(s.env, "REDIS_URL="+s.redisURL)
	} else {
		id := "e2e-embedded-" + strings.ToLower(rand.Text()[:8])
		s.env = append(s.env, "EXECUTOR_ID="+id)
		s.executors = append(s.executors, id)
	}
	if o.s3 {
		s.s3 = testenv.S3(t, "runbox-e2e")
		s.roots = map[string]string{}
		s.rootsDir = t.TempDir()
		t.Cleanup(func() { testenv.UnmountUnder(t, s.rootsDir) })
		s.env = append(s.env, "FILE_SECRET=", "FILE_STORE=s3://runbox-e2e/files", "AWS_ENDPOINT_URL="+s.s3.Endpoint,
			"AWS_ACCESS_KEY_ID="+s.s3.AccessKey, "AWS_SECRET_ACCESS_KEY="+s.s3.SecretKey, "AWS_REGION="+s.s3.Region)
	}
	s.env = append(s.env, o.env...)
	t.Cleanup(func() { testenv.UnmountUnder(t, s.root) })
	t.Cleanup(s.stop)
	if !o.embedded {
		for range max(o.executors, 1) {
			s.startExecutor()
		}
	}
	s.spawn("api", bin.api)
	s.waitReady()
	return s
}

func (s *service) spawn(name, path string, env ...string) *proc {
	s.t.Helper()
	cmd := exec.Command(path)
	cmd.Env = append(append([]string{}, s.env...), env...)
	p := &proc{name: name, cmd: cmd, out: &syncBuffer{}, done: make(chan struct{})}
	cmd.Stdout, cmd.Stderr = p.out, p.out
	var live *os.File
	if dir := os.Getenv("E2E_LOG_DIR"); dir != "" {
		// Followed while the test runs (a stall is seen as it happens),
		// not only printed once a failed test has stopped the service.
		f, err := os.Create(filepath.Join(dir, strings.ReplaceAll(name, " ", "-")+".log"))
		if err != nil {
			s.t.Fatal(err)
		}
		live = f
		cmd.Stdout = io.MultiWriter(p.out, f)
		cmd.Stderr = cmd.Stdout
	}
	if err := cmd.Start(); err != nil {
		s.t.Fatalf("start %s: %v", name, err)
	}
	go func() {
		_ = cmd.Wait()
		if live != nil {
			live.Close()
		}
		close(p.done)
	}()
	s.mu.Lock()
	s.procs = append(s.procs, p)
	s.mu.Unlock()
	return p
}

// startExecutor starts a standalone executor with an id of its own.
func (s *service) startExecutor(env ...string) (*proc, string) {
	id := "e2e-" + strings.ToLower(rand.Text()[:10])
	s.mu.Lock()
	s.executors = append(s.executors, id)
	if s.s3 != nil {
		root, err := os.MkdirTemp(s.rootsDir, "executor-")
		if err != nil {
			s.t.Fatal(err)
		}
		s.roots[id] = root
		env = append(env, "SANDBOX_ROOT="+root)
	}
	s.mu.Unlock()
	return s.spawn("executor "+id, bin.executor, append([]string{"EXECUTOR_ID=" + id}, env...)...), id
}

func (s *service) stop() {
	for _, p := range s.procs {
		_ = p.cmd.Process.Signal(os.Interrupt)
	}
	// Longer than an executor gives itself to remove its sandboxes (90 s):
	// one killed before that leaves them, which is not what is tested.
	for _, p := range s.procs {
		select {
		case <-p.done:
		case <-time.After(2 * time.Minute):
			_ = p.cmd.Process.Kill()
			<-p.done
		}
	}
	for _, id := range s.executors {
		if n := s.containers(id); n != 0 {
			s.t.Errorf("executor %s left %d containers", id, n)
		}
	}
	if s.t.Failed() {
		for _, p := range s.procs {
			s.t.Logf("--- output of %s ---\n%s", p.name, p.out.String())
		}
	}
}

// containers counts the sandboxes (containers or pods) of an executor.
func (s *service) containers(executor string) int { return len(s.containerIDs(executor)) }

// containerIDs returns the host names (a container's 12 hex digits, a
// pod's name) of an executor's sandboxes.
func (s *service) containerIDs(executor string) map[string]bool {
	return s.sandboxes.hosts(s.t, executor)
}

// containerExists reports whether a sandbox (by host name) exists.
func (s *service) containerExists(id string) bool { return s.sandboxes.exists(s.t, id) }

// containerExecutor returns the executor a sandbox belongs to.
func (s *service) containerExecutor(id string) string { return s.sandboxes.executorOf(s.t, id) }

func (s *service) waitReady() {
	s.t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		resp, err := http.Get(s.url + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	s.t.Fatal("service did not become ready")
}

// request makes an authenticated REST call and decodes a JSON answer.
func (s *service) request(method, path string, body any, out any) int {
	s.t.Helper()
	var r io.Reader
	switch b := body.(type) {
	case nil:
	case string:
		r = strings.NewReader(b)
	default:
		j, _ := json.Marshal(b)
		r = bytes.NewReader(j)
	}
	req, _ := http.NewRequest(method, s.url+path, r)
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		s.t.Fatal(err)
	}
	defer resp.Body.Close()
	if out != nil {
		if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
			s.t.Fatalf("%s %s: decode answer: %v", method, path, err)
		}
	}
	return resp.StatusCode
}

// sign makes a download URL the way the contract defines it.
func (s *service) sign(cid, name string, exp int64) string {
	h := hmac.New(sha256.New, []byte(s.secret))
	fmt.Fprintf(h, "%s/%s\n%d", cid, name, exp)
	return fmt.Sprintf("%s/files/%s/%s?exp=%d&sig=%s", s.url, cid, name, exp, hex.EncodeToString(h.Sum(nil)))
}

type bearer = testenv.Bearer

// session connects the official MCP client over Streamable HTTP.
func (s *service) session(opts *mcp.ClientOptions) *mcp.ClientSession {
	s.t.Helper()
	return testenv.Session(s.t, s.url+"/mcp", token, opts)
}

// result is a RunResult as a client decodes it.
type result struct {
	Success         bool       `json:"success"`
	Output          string     `json:"output"`
	ExitCode        int        `json:"exit_code"`
	Stdout          string     `json:"stdout"`
	Stderr          string     `json:"stderr"`
	StdoutTruncated bool       `json:"stdout_truncated"`
	TimedOut        bool       `json:"timed_out"`
	OOMKilled       bool       `json:"oom_killed"`
	DurationMS      int64      `json:"duration_ms"`
	RunID           string     `json:"run_id"`
	ConversationID  string     `json:"conversationId"`
	Files           []fileInfo `json:"files"`
	Artifacts       []fileInfo `json:"artifacts"`
	Error           string     `json:"error"`
	Cancelled       bool       `json:"cancelled"`
	StateLost       bool       `json:"state_lost"`
	StateRestored   bool       `json:"state_restored"`
	LostVariables   []string   `json:"lost_variables"`
	Phase           string     `json:"phase"`
}

type fileInfo struct {
	Name      string `json:"name"`
	Path      string `json:"path"`
	SizeBytes int64  `json:"size_bytes"`
	MimeType  string `json:"mime_type"`
	URL       string `json:"url"`
}

type toolError struct {
	Error   string `json:"error"`
	Message string `json:"message"`
}

// call calls a tool and decodes its structured content into out.
func call(t *testing.T, cs *mcp.ClientSession, name string, args map[string]any, out any) *mcp.CallToolResult {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: name, Arguments: args})
	if err != nil {
		t.Fatalf("call %s: %v", name, err)
	}
	if out != nil {
		b, _ := json.Marshal(res.StructuredContent)
		if err := json.Unmarshal(b, out); err != nil {
			t.Fatalf("call %s: decode %s: %v", name, b, err)
		}
	}
	return res
}

// runCode calls run_code and expects a result, not a tool error.
func runCode(t *testing.T, cs *mcp.ClientSession, args map[string]any) result {
	t.Helper()
	var r result
	res := call(t, cs, "run_code", args, &r)
	if res.IsError {
		t.Fatalf("run_code failed as a tool: %s", text(res))
	}
	return r
}

func text(res *mcp.CallToolResult) string {
	var parts []string
	for _, c := range res.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			parts = append(parts, tc.Text)
		}
	}
	return strings.Join(parts, "\n")
}

func get(t *testing.T, url string) (int, []byte) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

func jsonUnmarshal(s string, v any) error { return json.Unmarshal([]byte(s), v) }
func jsonMarshal(v any) ([]byte, error)   { return json.Marshal(v) }
