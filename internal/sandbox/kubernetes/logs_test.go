package kubernetes

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"os"
	"os/exec"
	"testing"

	"k8s.io/klog/v2"
)

// TestRouteClientLogs runs in a process of its own: klog's logger is the
// process's, and client-go goroutines that outlive the cluster tests
// (a stream's heartbeat) log through it while a test would swap it.
func TestRouteClientLogs(t *testing.T) {
	if os.Getenv("RUNBOX_TEST_ROUTE_LOGS") != "1" {
		cmd := exec.Command(os.Args[0], "-test.run=^TestRouteClientLogs$", "-test.count=1")
		cmd.Env = append(os.Environ(), "RUNBOX_TEST_ROUTE_LOGS=1")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("%v\n%s", err, out)
		}
		return
	}
	var buf bytes.Buffer
	RouteClientLogs(slog.New(slog.NewJSONHandler(&buf, nil)))
	klog.ErrorS(nil, "watch ended", "pod", "p1")
	klog.Flush()
	var rec map[string]any
	if err := json.Unmarshal(buf.Bytes(), &rec); err != nil {
		t.Fatalf("not one JSON record: %q", buf.String())
	}
	if rec["msg"] != "watch ended" || rec["component"] != "client-go" || rec["pod"] != "p1" || rec["level"] != "ERROR" {
		t.Errorf("record %v", rec)
	}
}
