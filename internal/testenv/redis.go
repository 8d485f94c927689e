// Package testenv starts the real services that integration tests run
// against: a redis-server on a free loopback port, and checks for Docker.
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
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		t.Fatal("redis-server is not installed (apt-get install redis-server): integration tests need it")
	}
	port := FreePort(t)
	dir := t.TempDir()
	cmd := exec.Command(bin, append([]string{"--port", fmt.Sprint(port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--dir", dir, "--loglevel", "warning"}, args...)...)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatalf("start redis-server: %v", err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		if t.Failed() {
			t.Logf("--- redis-server ---\n%s", out.String())
		}
	})
	url := fmt.Sprintf("redis://127.0.0.1:%d/0", port)
	opt, _ := redis.ParseURL(url)
	rdb := redis.NewClient(opt)
	defer rdb.Close()
	deadline := time.Now().Add(10 * time.Second)
	for rdb.Ping(context.Background()).Err() != nil {
		if time.Now().After(deadline) {
			t.Fatal("redis-server did not come up")
		}
		time.Sleep(20 * time.Millisecond)
	}
	return url
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
