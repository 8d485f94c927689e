package refusals

import (
	"context"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/runbox-dev/runbox/internal/audit"
)

type auditLog struct {
	mu      sync.Mutex
	entries []audit.Refusal
}

func (a *auditLog) Refused(_ context.Context, r audit.Refusal) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.entries = append(a.entries, r)
}

func (a *auditLog) list() []audit.Refusal {
	a.mu.Lock()
	defer a.mu.Unlock()
	return append([]audit.Refusal(nil), a.entries...)
}

// A flood from one source costs the audit log two entries per window
// (its first refusal, then how many there were), whatever its size; past
// its budget the source is answered 429 until the window ends; another
// source is not held back by it.
func TestRefuseCountsPerSourceAndWindow(t *testing.T) {
	clock := clockwork.NewFakeClock()
	log := &auditLog{}
	reg := prometheus.NewRegistry()
	l := New(Options{Budget: 10, Window: time.Minute, Audit: log, Clock: clock, Registerer: reg})
	ctx := context.Background()
	stranger := netip.MustParseAddr("192.0.2.7")
	for i := range 5000 {
		wait := l.Refuse(ctx, stranger, "POST /mcp")
		if (i < 10) != (wait == 0) {
			t.Fatalf("request %d: wait %v (budget 10)", i+1, wait)
		}
		if wait > time.Minute {
			t.Fatalf("wait %v past the window", wait)
		}
	}
	if got := log.list(); len(got) != 1 || got[0].Count != 1 || got[0].Address != "192.0.2.7" || got[0].Routes[0] != "POST /mcp" {
		t.Fatalf("entries while the window lasts: %+v", got)
	}
	// Another source has its own budget.
	if wait := l.Refuse(ctx, netip.MustParseAddr("198.51.100.1"), "GET /v1/runs"); wait != 0 {
		t.Fatalf("another source waits %v", wait)
	}
	if n := testutil.ToFloat64(l.refused.WithLabelValues("rate_limited")); n != 4990 {
		t.Errorf("rate_limited counter %v, want 4990", n)
	}
	if n := testutil.ToFloat64(l.refused.WithLabelValues("unauthorized")); n != 11 {
		t.Errorf("unauthorized counter %v, want 11", n)
	}

	// The window ends: its count is recorded once, and the source starts
	// afresh.
	clock.Advance(time.Minute)
	l.flush(false)(ctx)
	got := log.list()
	var summary *audit.Refusal
	for i := range got {
		if got[i].Address == "192.0.2.7" && got[i].Count > 1 {
			summary = &got[i]
		}
	}
	if len(got) != 3 || summary == nil || summary.Count != 5000 || summary.Limited != 4990 {
		t.Fatalf("entries after the window: %+v", got)
	}
	if wait := l.Refuse(ctx, stranger, "POST /mcp"); wait != 0 {
		t.Errorf("a new window waits %v", wait)
	}
}

// IPv6 sources are counted per /64: a host has a whole one to pick
// addresses from.
func TestRefuseCountsIPv6PerPrefix(t *testing.T) {
	l := New(Options{Budget: 3, Clock: clockwork.NewFakeClock()})
	ctx := context.Background()
	var wait time.Duration
	for i := range 4 {
		wait = l.Refuse(ctx, netip.AddrFrom16([16]byte{0x20, 0x01, 0x0d, 0xb8, 15: byte(i + 1)}), "POST /mcp")
	}
	if wait == 0 {
		t.Error("four addresses of one /64 were not counted together")
	}
	if wait := l.Refuse(ctx, netip.MustParseAddr("::ffff:192.0.2.1"), "POST /mcp"); wait != 0 {
		t.Errorf("an IPv4-mapped address: wait %v", wait)
	}
}

// The table is bounded: sources past it are counted together and never
// answered 429; their entries are bounded too; Stop records what is open.
func TestRefuseBoundsTheSources(t *testing.T) {
	clock := clockwork.NewFakeClock()
	log := &auditLog{}
	l := New(Options{Budget: 1, MaxSources: 100, Audit: log, Clock: clock})
	if err := l.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for i := range 10000 {
		addr := netip.AddrFrom4([4]byte{10, byte(i >> 16), byte(i >> 8), byte(i)})
		if wait := l.Refuse(ctx, addr, "POST /mcp"); wait != 0 && i >= 100 {
			t.Fatalf("source %d past the table waits %v", i, wait)
		}
	}
	l.mu.Lock()
	n := len(l.sources)
	l.mu.Unlock()
	if n > 100 {
		t.Errorf("%d sources kept, bound 100", n)
	}
	l.Stop()
	got := log.list()
	if len(got) > 102 {
		t.Fatalf("%d entries for 10000 sources past a table of 100", len(got))
	}
	var others *audit.Refusal
	for i := range got {
		if got[i].Address == "" && got[i].Count > 1 {
			others = &got[i]
		}
	}
	if others == nil || others.Count != 9900 || others.Limited != 0 {
		t.Errorf("the sources past the table: %+v", others)
	}
}
