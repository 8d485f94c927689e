// Package testenv starts the real services that integration tests run
// against: a redis-server on a free loopback port, S3 (versitygw), Gitea,
// the test Kubernetes cluster. It is for tests alone (rules_test holds
// it so): it may hand them a raw go-redis client to look at what the store
// wrote. The Docker Engine's client is package dockertest's, beside the
// Docker engine.
package testenv

import (
	"bytes"
	"context"
	"fmt"
	mrand "math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
)

// Redis starts a real redis-server for the test and returns its URL, with
// args added to its command line (such as "--maxmemory", "2mb"). The
// server is stopped when the test ends. A machine without redis-server
// fails the test: integration tests must not skip in CI.
func Redis(t testing.TB, args ...string) string {
	t.Helper()
	return StartRedis(t, args...).URL
}

// RedisServer is a real redis-server a test started, which the test may
// stop and start again: on the same port, with the same data folder and
// command line, as a restarted deployment's Redis.
type RedisServer struct {
	// URL is the server's, the same across restarts.
	URL string

	t    testing.TB
	bin  string
	args []string
	out  bytes.Buffer // every run's output, for failures

	mu  sync.Mutex
	cmd *exec.Cmd // nil while stopped
}

// StartRedis starts a RedisServer, with args added to its command line
// after the defaults (no persistence); later arguments win, so
// "--appendonly", "yes" turns the AOF on. It is stopped when the test
// ends.
func StartRedis(t testing.TB, args ...string) *RedisServer {
	t.Helper()
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		t.Fatal("redis-server is not installed (apt-get install redis-server): integration tests need it")
	}
	port := FreePort(t)
	r := &RedisServer{
		URL: fmt.Sprintf("redis://127.0.0.1:%d/0", port),
		t:   t,
		bin: bin,
		args: append([]string{"--port", fmt.Sprint(port), "--bind", "127.0.0.1",
			"--save", "", "--appendonly", "no", "--dir", t.TempDir(), "--loglevel", "warning"}, args...),
	}
	t.Cleanup(func() {
		r.Stop(os.Kill)
		if t.Failed() {
			t.Logf("--- redis-server ---\n%s", r.out.String())
		}
	})
	r.Start()
	return r
}

// Start starts the server, stopped, again, and waits until it answers.
func (r *RedisServer) Start() {
	r.t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cmd != nil {
		r.t.Fatal("redis-server is running already")
	}
	cmd := exec.Command(r.bin, r.args...)
	cmd.Stdout, cmd.Stderr = &r.out, &r.out
	if err := cmd.Start(); err != nil {
		r.t.Fatalf("start redis-server: %v", err)
	}
	r.cmd = cmd
	opt, _ := redis.ParseURL(r.URL)
	rdb := redis.NewClient(opt)
	defer rdb.Close()
	// Ping is refused (LOADING) while the AOF is read back.
	deadline := time.Now().Add(30 * time.Second)
	for rdb.Ping(context.Background()).Err() != nil {
		if time.Now().After(deadline) {
			r.t.Fatal("redis-server did not come up")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Stop sends the server sig — os.Interrupt or syscall.SIGTERM to shut it
// down as a restart does (the AOF flushed), os.Kill as a crash — and
// waits for it to exit. A stopped server is left so.
func (r *RedisServer) Stop(sig os.Signal) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cmd == nil {
		return
	}
	_ = r.cmd.Process.Signal(sig)
	_ = r.cmd.Wait()
	r.cmd = nil
}

// Miniredis starts an in-process Redis for unit tests.
func Miniredis(t testing.TB) (*miniredis.Miniredis, string) {
	t.Helper()
	mr := miniredis.RunT(t)
	return mr, "redis://" + mr.Addr() + "/0"
}

// Client returns a go-redis client for url, closed when the test ends.
// Its reads and writes wait up to 30 s, not go-redis's 3: under -race on
// a loaded CI machine a Lua script over a thousand runs in miniredis once
// took longer, and the test failed on a timeout, not on what it checks.
func Client(t testing.TB, url string) *redis.Client {
	t.Helper()
	opt, err := redis.ParseURL(url)
	if err != nil {
		t.Fatal(err)
	}
	opt.ReadTimeout, opt.WriteTimeout = 30*time.Second, 30*time.Second
	rdb := redis.NewClient(opt)
	t.Cleanup(func() { rdb.Close() })
	return rdb
}

// FreePort returns a loopback TCP port nothing listens on, below the
// kernel's range of ephemeral ports, and never the same twice in a
// process. A port the kernel picks for bind(0) comes from that range and
// is free only until another connection's ephemeral port or another
// test's bind(0) takes it (an api once failed to bind the port its
// harness had just been given, which the test's Redis had taken).
func FreePort(t testing.TB) int {
	t.Helper()
	portsMu.Lock()
	defer portsMu.Unlock()
	for range 1000 {
		port := minPort + mrand.IntN(maxPort-minPort)
		if portsGiven[port] {
			continue
		}
		l, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
		if err != nil {
			continue
		}
		l.Close()
		portsGiven[port] = true
		return port
	}
	t.Fatal("no free port below the ephemeral range")
	return 0
}

// The ports FreePort hands out: [minPort, maxPort), below Linux's default
// ephemeral range (32768–60999).
const (
	minPort = 20000
	maxPort = 32000
)

var (
	portsMu    sync.Mutex
	portsGiven = map[int]bool{}
)

// RepoRoot returns the module's root folder.
func RepoRoot(t testing.TB) string {
	t.Helper()
	dir, err := repoRoot()
	if err != nil {
		t.Fatal(err)
	}
	return dir
}

// WriteFile writes body to a new file name in a temporary folder of the
// test and returns its path.
func WriteFile(t testing.TB, name, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(body), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}
