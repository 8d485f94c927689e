package kubernetes

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"testing"

	"k8s.io/klog/v2"
)

func TestRouteClientLogs(t *testing.T) {
	var buf bytes.Buffer
	RouteClientLogs(slog.New(slog.NewJSONHandler(&buf, nil)))
	t.Cleanup(klog.ClearLogger)
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
