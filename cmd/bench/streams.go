package main

import (
	"context"
	"crypto/rand"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"time"

	"github.com/runbox-dev/runbox/internal/bench"
	"github.com/runbox-dev/runbox/internal/sandbox"
	"github.com/runbox-dev/runbox/internal/sandbox/docker"
)

// webServer serves a small page on 8000, in a sandbox or a container.
const webServer = `import http.server
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = b"hello from the sandbox\n"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a):
        pass
http.server.ThreadingHTTPServer(("0.0.0.0", 8000), H).serve_forever()
`

// dialPortRow measures a small GET to a server in a sandbox through
// sandbox.Manager.DialPort (a stream through the agent, a new connection
// each time, as previews make them) against the same GET straight to the
// same server in a container on Docker's bridge network.
func dialPortRow(ctx context.Context, n int) (row, error) {
	log.Print("GET through DialPort vs straight to a container on the bridge")
	engine, err := docker.Open(ctx, docker.Options{})
	if err != nil {
		return row{}, err
	}
	defer engine.Close()
	m := sandbox.NewManager(engine, sandbox.Options{ExecutorID: "bench-" + strings.ToLower(rand.Text()[:8]),
		Limits:  sandbox.Limits{Memory: 512 << 20, NanoCPUs: 1e9, Pids: 128},
		MaxWarm: sandbox.WarmLimits{Default: 1}, ImageTag: runnerTag()})
	defer m.Shutdown(context.WithoutCancel(ctx))
	runners, err := m.Discover(ctx)
	if err != nil {
		return row{}, err
	}
	image := ""
	for _, r := range runners {
		if r.Language == "python" {
			image = r.Image
		}
	}
	dir, err := os.MkdirTemp("", "runbox-bench-web-")
	if err != nil {
		return row{}, err
	}
	defer os.RemoveAll(dir)
	os.Chmod(dir, 0o777)
	rctx, stop := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		m.Run(rctx, sandbox.Request{RunID: "bench-web", ConversationID: "bench-web", Language: "python", Code: webServer,
			Timeout: 30 * time.Minute, DataDir: dir}, func(sandbox.Stream, []byte) {})
	}()
	defer func() { stop(); <-done }()
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(50 * time.Millisecond) {
		if yes, _ := m.Listening(ctx, "bench-web", 8000); yes {
			break
		}
		if time.Now().After(deadline) {
			return row{}, fmt.Errorf("the sandbox's server did not start")
		}
	}
	through, err := timeGets(ctx, n, "http://sandbox/", func(ctx context.Context, _, _ string) (net.Conn, error) {
		return m.DialPort(ctx, "bench-web", 8000)
	})
	if err != nil {
		return row{}, err
	}

	out, err := exec.CommandContext(ctx, "docker", "run", "-d", "--rm", "--network", "bridge", "--entrypoint", "python3",
		image, "-c", webServer).Output()
	if err != nil {
		return row{}, fmt.Errorf("docker run: %w", err)
	}
	id := strings.TrimSpace(string(out))
	defer exec.Command("docker", "rm", "-f", id).Run()
	ip, err := exec.CommandContext(ctx, "docker", "inspect", "-f", "{{.NetworkSettings.IPAddress}}", id).Output()
	if err != nil {
		return row{}, err
	}
	addr := net.JoinHostPort(strings.TrimSpace(string(ip)), "8000")
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(50 * time.Millisecond) {
		if c, err := net.DialTimeout("tcp", addr, time.Second); err == nil {
			c.Close()
			break
		}
		if time.Now().After(deadline) {
			return row{}, fmt.Errorf("the container's server did not start")
		}
	}
	var d net.Dialer
	direct, err := timeGets(ctx, n, "http://"+addr+"/", d.DialContext)
	if err != nil {
		return row{}, err
	}
	t, b := bench.Summarize(through), bench.Summarize(direct)
	return row{
		measure:  "small `GET` to a server in a sandbox through `DialPort` (a new stream each), vs straight to a container on the bridge",
		result:   pair(t),
		baseline: "bridge " + pair(b),
		ratio:    fmt.Sprintf("%s; +%s", ratio(t.Median, b.Median), ms(t.Median-b.Median)),
		target:   "p50 ≤ direct + 5 ms",
		met:      t.Median <= b.Median+5*time.Millisecond,
	}, nil
}

// timeGets times n GETs of url, each on a new connection from dial.
func timeGets(ctx context.Context, n int, url string, dial func(context.Context, string, string) (net.Conn, error)) ([]time.Duration, error) {
	c := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{DisableKeepAlives: true, DialContext: dial}}
	var out []time.Duration
	for i := range n + 5 {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		t := time.Now()
		resp, err := c.Do(req)
		if err != nil {
			return nil, err
		}
		_, err = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if err != nil {
			return nil, err
		}
		if i >= 5 { // the first few warm up both ends
			out = append(out, time.Since(t))
		}
	}
	return out, nil
}

// runnerTag is the tag of the runner images to measure, as executors
// choose it.
func runnerTag() string {
	if t := os.Getenv("RUNNER_TAG"); t != "" {
		return t
	}
	return sandbox.DefaultImageTag
}
