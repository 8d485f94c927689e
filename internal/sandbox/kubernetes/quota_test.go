package kubernetes

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/runbox-dev/runbox/internal/agent"
	"github.com/runbox-dev/runbox/internal/sandbox"
)

// TestPodsHeldToTheQuota: through the sandbox manager, a pod's run that
// makes files without end, or writes past the quota's bytes in one file
// or in several, is stopped with its bound named; its pod is removed
// and nothing of its files reaches the conversation's folder, so that
// the next run finds the folder as the run before left it.
func TestPodsHeldToTheQuota(t *testing.T) {
	// 1000 entries of 4 KiB at least each take half the bytes: the
	// entries are passed first.
	const quotaBytes, quotaFiles = 8 << 20, 1000
	c := testCluster(t)
	e := c.engine(t)
	eng := &Sandboxes{Engine: e, Quota: agent.Quota{Bytes: quotaBytes, Entries: quotaFiles}, ImageList: c.images}
	m := manager(t, eng, sandbox.Options{ExecutorID: "ex-quota",
		Limits:  sandbox.Limits{Memory: 256 << 20, NanoCPUs: 1e9, Pids: 256, FileSize: quotaBytes},
		MaxWarm: sandbox.WarmLimits{Default: 2}})
	dir := filepath.Join(t.TempDir(), "conv")
	if err := os.Mkdir(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	run := func(code string) (sandbox.Outcome, string) {
		t.Helper()
		ctx, cancel := context.WithTimeout(t.Context(), 3*time.Minute)
		defer cancel()
		var out strings.Builder
		begin := time.Now()
		oc, err := m.Run(ctx, sandbox.Request{RunID: "run", ConversationID: "conv", Language: "python",
			Code: code, Timeout: 2 * time.Minute, DataDir: dir},
			func(s sandbox.Stream, p []byte) { out.Write(p) })
		if err != nil {
			t.Fatalf("run: %v (output %q)", err, out.String())
		}
		t.Logf("run of %d ms: %+v, output %q", time.Since(begin).Milliseconds(), oc, tail(out.String(), 200))
		return oc, out.String()
	}
	// What the folder holds, as the next run finds it: its entries, /data
	// too, and their bytes; and the pod it runs in.
	const look = "import os, socket\nn, b = 0, 0\nfor r, ds, fs in os.walk('.'):\n" +
		"    n += 1 + len(fs)\n    b += sum(os.path.getsize(os.path.join(r, f)) for f in fs)\n" +
		"print(n, b, socket.gethostname())"
	within := func(after string) string {
		t.Helper()
		oc, out := run(look)
		var n, b int
		var host string
		if _, err := fmt.Sscan(out, &n, &b, &host); err != nil || oc.ExitCode != 0 || oc.Quota != "" {
			t.Fatalf("the run after %s: %+v, %q", after, oc, out)
		}
		if n != 2 || b != 4 {
			t.Errorf("after %s the folder holds %d entries, %d bytes; want /data and keep.txt's 4 bytes", after, n, b)
		}
		return host
	}

	if oc, _ := run("open('keep.txt', 'w').write('kept')"); oc.ExitCode != 0 || oc.Quota != "" {
		t.Fatalf("the first run: %+v", oc)
	}
	host := within("the first run")
	for _, tt := range []struct {
		name, code, bound string
	}{
		{name: "500,000 files", bound: agent.QuotaEntries,
			code: "for i in range(500000):\n    open(f'f{i}', 'w').close()\n    if i % 10000 == 0: print(i, flush=True)"},
		{name: "one file past the bytes", bound: agent.QuotaBytes,
			code: "open('big', 'wb').write(b'x' * (12 << 20))"},
		{name: "files past the bytes", bound: agent.QuotaBytes,
			code: "for i in range(3):\n    open(f'part{i}', 'wb').write(b'x' * (4 << 20))"},
	} {
		oc, out := run(tt.code)
		if oc.Quota != tt.bound {
			t.Errorf("%s: %+v, %q; want past the quota's %s", tt.name, oc, tail(out, 200), tt.bound)
		}
		if next := within(tt.name); next == host {
			t.Errorf("after %s the next run is in the same pod, %s", tt.name, host)
		} else {
			host = next
		}
		if entries, err := os.ReadDir(dir); err != nil || len(entries) != 1 {
			t.Errorf("after %s the executor's folder holds %d entries (%v); want keep.txt", tt.name, len(entries), err)
		}
	}
}

// tail is the end of s, at most n bytes.
func tail(s string, n int) string { return s[max(0, len(s)-n):] }
