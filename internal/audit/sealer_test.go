package audit

import (
	"context"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/redis/go-redis/v9"

	"github.com/runbox-dev/runbox/internal/store"
	"github.com/runbox-dev/runbox/internal/store/auditlog"
	"github.com/runbox-dev/runbox/internal/testenv"
)

// roundTrips counts the round trips made to Redis on a client.
type roundTrips struct{ n atomic.Int64 }

func (r *roundTrips) DialHook(next redis.DialHook) redis.DialHook { return next }
func (r *roundTrips) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error { r.n.Add(1); return next(ctx, cmd) }
}
func (r *roundTrips) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error { r.n.Add(1); return next(ctx, cmds) }
}

// TestSealerRoundTrips: while a sealer holds its lease, sealing what a
// call recorded takes two round trips (the wait for it, the seal), not a
// read of the head, of the lease and of the log's length besides; an
// archive's bound is checked from what the seal returns. The chain
// verifies, and an export still happens past the bound.
func TestSealerRoundTrips(t *testing.T) {
	ctx := context.Background()
	url := testenv.Redis(t)
	rdb := testenv.Client(t, url)
	rt := &roundTrips{}
	rdb.AddHook(rt)
	st := auditlog.New(store.NewConn(rdb))
	chain := NewChain([]byte("audit-key-0123456789"))
	// A fake clock: the lease is renewed after leaseRenew of it, which
	// never passes here.
	clock := clockwork.NewFakeClock()
	s := NewSealer(st, chain, 0, clock, slog.New(slog.DiscardHandler))
	a := archives["host folder"](t)
	s.Archive(a, 60)
	if err := s.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Stop)

	reader := auditlog.New(store.NewConn(testenv.Client(t, url)))
	rec := NewRecorder(auditlog.New(store.NewConn(testenv.Client(t, url))), clock, slog.New(slog.DiscardHandler))
	sealedUpTo := func(seq int64) {
		t.Helper()
		deadline := time.Now().Add(10 * time.Second)
		for {
			h, err := reader.Head(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if h.Seq >= seq {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("sealed up to %d, want %d", h.Seq, seq)
			}
			time.Sleep(time.Millisecond)
		}
	}
	c, err := rec.Begin(ctx, Entry{Client: "alice", Tool: "run_code"})
	if err != nil {
		t.Fatal(err)
	}
	sealedUpTo(1)
	start := time.Now()
	before := rt.n.Load()
	const n = 40
	for i := range int64(n) {
		c.End(ctx, "", "run_x")
		sealedUpTo(2*i + 2)
		if c, err = rec.Begin(ctx, Entry{Client: "alice", Tool: "run_code"}); err != nil {
			t.Fatal(err)
		}
		sealedUpTo(2*i + 3)
	}
	// Each seal: its wait and the seal; each export (past the bound of
	// 60, two or three here) a few more; and a wait that ended empty, at
	// most one a second. (Reading the lease, the head and the log's
	// length besides made it five a seal.)
	trips := rt.n.Load() - before
	t.Logf("%d round trips", trips)
	if limit := int64(2*2*n+30) + int64(time.Since(start)/time.Second); trips > limit {
		t.Errorf("%d entries sealed one at a time in %d round trips; want at most %d", 2*n, trips, limit)
	}
	_, segs, err := reader.Archived(ctx)
	if err != nil || len(segs) == 0 {
		t.Errorf("no segment exported past the bound: %v, %v", segs, err)
	}
	if got, err := walkVerify(ctx, reader, a, chain); err != nil || got != 2*n+1 {
		t.Errorf("verify: %d entries, %v", got, err)
	}
}
