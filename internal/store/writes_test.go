package store

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/runbox-dev/runbox"
	"github.com/runbox-dev/runbox/internal/testenv"
)

// TestWriteWatch: a real redis-server at its maxmemory under noeviction
// refuses writes; the process says so in its log (once as it starts), in
// its metrics and in its readiness check, and again once Redis has room.
func TestWriteWatch(t *testing.T) {
	ctx := context.Background()
	rdb := testenv.Client(t, testenv.Redis(t, "--maxmemory", "3mb", "--maxmemory-policy", "noeviction"))
	var logs bytes.Buffer
	conn := NewConn(rdb)
	w := conn.WatchWrites(prometheus.NewRegistry(), slog.New(slog.NewTextHandler(&logs, nil)))
	if err := w.Check(ctx); err != nil {
		t.Fatalf("check with room: %v", err)
	}
	st := New(conn)
	// Small values: a large command's own buffer counts against the
	// limit while it is read, and is freed once it is refused. Redis is
	// full when a small write is refused; memory it frees meanwhile
	// (buffers) may let one more through, so fill again.
	n := 0
	fill := func() {
		for ; n < 100000; n++ {
			if err := rdb.Set(ctx, fmt.Sprintf("fill:%d", n), strings.Repeat("x", 512), 0).Err(); err != nil {
				return
			}
		}
		t.Fatal("Redis never refused a write")
	}
	fill()
	// What the service writes is refused too, and seen.
	for i := 0; st.Heartbeat(ctx, runbox.ExecutorInfo{ID: "ex"}, time.Minute) == nil; i++ {
		if i == 10 {
			t.Fatal("a heartbeat was written past maxmemory")
		}
		fill()
	}
	var err error
	for i := 0; ; i++ {
		if err = w.Check(ctx); err != nil || i == 10 {
			break
		}
		fill()
	}
	if err == nil || !strings.Contains(err.Error(), "refuses writes") {
		t.Fatalf("check while full: %v", err)
	}
	if testutil.ToFloat64(w.gauge) != 1 || testutil.ToFloat64(w.refusals) < 3 {
		t.Errorf("metrics: refusing %v, refusals %v", testutil.ToFloat64(w.gauge), testutil.ToFloat64(w.refusals))
	}
	// One line when refusals start (and one when they end: at its limit,
	// memory Redis frees may let a write through), not one per command.
	if refuses, accepts := strings.Count(logs.String(), "Redis refuses writes"), strings.Count(logs.String(), "Redis accepts writes again"); refuses != accepts+1 {
		t.Errorf("%d log lines saying Redis refuses writes and %d that it accepts them again:\n%s", refuses, accepts, logs.String())
	}

	if err := rdb.FlushDB(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	if err := w.Check(ctx); err != nil {
		t.Fatalf("check with room again: %v", err)
	}
	if testutil.ToFloat64(w.gauge) != 0 || !strings.Contains(logs.String(), "Redis accepts writes again") {
		t.Errorf("recovery not seen: gauge %v\n%s", testutil.ToFloat64(w.gauge), logs.String())
	}
}
