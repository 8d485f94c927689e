package app

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/runbox-dev/runbox/internal/config"
	"github.com/runbox-dev/runbox/internal/testenv"
)

// TestOpenRedisSentinel: a redis-sentinel:// URL, as asynq parses it,
// reaches the master the sentinel names.
func TestOpenRedisSentinel(t *testing.T) {
	master := testenv.Redis(t)
	masterAddr := strings.TrimSuffix(strings.TrimPrefix(master, "redis://"), "/0")
	host, port, _ := strings.Cut(masterAddr, ":")
	sport := testenv.FreePort(t)
	dir := t.TempDir()
	conf := filepath.Join(dir, "sentinel.conf")
	os.WriteFile(conf, []byte(fmt.Sprintf("port %d\nbind 127.0.0.1\nsentinel monitor mymaster %s %s 1\n", sport, host, port)), 0o600)
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		t.Fatal("redis-server is not installed")
	}
	cmd := exec.Command(bin, conf, "--sentinel")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })

	cfg := &config.Config{RedisURL: fmt.Sprintf("redis-sentinel://127.0.0.1:%d?master=mymaster", sport)}
	ctx := context.Background()
	deadline := time.Now().Add(10 * time.Second)
	for {
		rds, err := OpenRedis(ctx, cfg)
		if err == nil {
			defer rds.Close()
			if err := rds.Conn.Redis().Set(ctx, "through-sentinel", "1", 0).Err(); err != nil {
				t.Fatal(err)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("open through sentinel: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	direct := testenv.Client(t, master)
	if v, _ := direct.Get(ctx, "through-sentinel").Result(); v != "1" {
		t.Error("the write did not reach the master")
	}
}
