package testenv

import (
	"bytes"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/runbox-dev/runbox/internal/s3store"
)

// S3 starts a real S3 server (versitygw over a temporary folder) for the
// test and returns how to reach it, with bucket as the store's bucket
// (made by the store when it opens). A machine without versitygw fails the
// test: `make test-deps` installs it.
func S3(t testing.TB, bucket string) *s3store.Options {
	t.Helper()
	bin, err := exec.LookPath("versitygw")
	if err != nil {
		gopath, _ := exec.Command("go", "env", "GOPATH").Output()
		bin = filepath.Join(strings.TrimSpace(string(gopath)), "bin", "versitygw")
		if _, err := os.Stat(bin); err != nil {
			t.Fatal("versitygw is not installed (make test-deps, or go install github.com/versity/versitygw/cmd/versitygw@v1.8.0): file-store tests need it")
		}
	}
	addr := fmt.Sprintf("127.0.0.1:%d", FreePort(t))
	dir := t.TempDir()
	cmd := exec.Command(bin, "--access", "runbox-test", "--secret", "runbox-test-secret", "--port", addr, "posix", dir)
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Start(); err != nil {
		t.Fatalf("start versitygw: %v", err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		if t.Failed() {
			t.Logf("--- versitygw ---\n%s", out.String())
		}
	})
	deadline := time.Now().Add(20 * time.Second)
	for {
		c, err := net.Dial("tcp", addr)
		if err == nil {
			c.Close()
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("versitygw did not come up: %s", out.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	return &s3store.Options{Bucket: bucket, Endpoint: "http://" + addr, Region: "us-east-1",
		AccessKey: "runbox-test", SecretKey: "runbox-test-secret"}
}
