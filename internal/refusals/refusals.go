// Package refusals bounds what requests without a valid token cost.
// Anyone who can reach the api can send them, as fast as they like, and
// each used to write two audit entries to Redis: a loop could fill it,
// and once Redis refuses writes every call fails (a call that cannot be
// audited is refused).
//
// Such requests are counted in memory per source and window: an IPv4
// address, or an IPv6 /64 (one host's share of a network), for a minute
// from its first refusal. The audit log gets the first refusal of a
// window as it comes, and when the window ends one entry saying how many
// followed ("N refused requests from A between T1 and T2"): at most two
// entries per source and window, whatever the rate. A source past its
// budget in a window is answered 429 until the window ends. A valid token
// is never held back, whatever its address has done: strangers behind the
// same address (a NAT, a proxy) cannot lock a client out.
//
// The table is bounded: past MaxSources, windows that ended are flushed
// first, and a source that still finds no room is counted with the others
// that found none, in one window of its own (never answered 429: it
// cannot be told apart from them).
package refusals

import (
	"context"
	"log/slog"
	"net/netip"
	"slices"
	"sync"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/runbox-dev/runbox/internal/audit"
	"github.com/runbox-dev/runbox/internal/lifecycle"
)

// Defaults of Options.
const (
	DefaultWindow     = time.Minute
	DefaultBudget     = 60
	DefaultMaxSources = 10000
)

// maxRoutes bounds the routes a window remembers.
const maxRoutes = 8

// Auditor records refused requests; *audit.Recorder is one.
type Auditor interface {
	Refused(ctx context.Context, r audit.Refusal)
}

// Options configure a Limiter.
type Options struct {
	// Budget is how many refused requests a source may make in a window
	// before it is answered 429 (MCP_UNAUTHORIZED_PER_MINUTE).
	Budget int
	// Window is how long a source's count lasts from its first refusal.
	Window time.Duration
	// MaxSources bounds the sources counted apart.
	MaxSources int
	// Audit, when set, records the refusals.
	Audit      Auditor
	Registerer prometheus.Registerer
	Clock      clockwork.Clock
	Logger     *slog.Logger
}

// Limiter counts refused requests per source. Start it: it records the
// windows that end; Stop records those still open.
type Limiter struct {
	lifecycle.Base
	o        Options
	log      *slog.Logger
	refused  *prometheus.CounterVec
	tracked  prometheus.Gauge
	mu       sync.Mutex
	sources  map[netip.Prefix]*window
	overflow *window   // the sources that found no room
	swept    time.Time // when a full table was last swept
}

// window is one source's count.
type window struct {
	start, last time.Time
	count       int
	limited     int
	routes      []string
}

// New returns a Limiter.
func New(o Options) *Limiter {
	if o.Budget <= 0 {
		o.Budget = DefaultBudget
	}
	if o.Window <= 0 {
		o.Window = DefaultWindow
	}
	if o.MaxSources <= 0 {
		o.MaxSources = DefaultMaxSources
	}
	if o.Clock == nil {
		o.Clock = clockwork.NewRealClock()
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	l := &Limiter{o: o, log: o.Logger.With("component", "refusals"), sources: map[netip.Prefix]*window{},
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "runbox_refused_requests_total",
			Help: "Requests refused for want of a valid token, by answer: unauthorized (401) or rate_limited (429, the source was past its budget).",
		}, []string{"answer"}),
		tracked: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "runbox_refused_sources",
			Help: "Sources (IPv4 addresses, IPv6 /64s) whose refused requests are being counted.",
		}),
	}
	if o.Registerer != nil {
		o.Registerer.MustRegister(l.refused, l.tracked)
	}
	return l
}

// Start records the windows that end, until Stop.
func (l *Limiter) Start(ctx context.Context) error {
	return l.Base.Run(ctx, func(ctx context.Context) {
		lifecycle.Every(l.o.Clock, l.o.Window/4, l.flush(false))(ctx)
		l.flush(true)(context.WithoutCancel(ctx))
	})
}

// Source is what a request's address is counted as: the address itself,
// or its /64 for IPv6.
func Source(addr netip.Addr) netip.Prefix {
	addr = addr.Unmap().WithZone("")
	if addr.Is4() {
		return netip.PrefixFrom(addr, 32)
	}
	p, _ := addr.Prefix(64)
	return p
}

// Refuse counts a request from addr to route refused for its token, and
// records the first of its source's window. It returns 0 when the request
// is answered 401, or how long until the source's window ends when it is
// past its budget (answer 429).
func (l *Limiter) Refuse(ctx context.Context, addr netip.Addr, route string) time.Duration {
	now := l.o.Clock.Now()
	src := Source(addr)
	var ended []audit.Refusal
	l.mu.Lock()
	w := l.sources[src]
	if w != nil && !now.Before(w.start.Add(l.o.Window)) {
		ended = append(ended, w.refusal(src))
		delete(l.sources, src)
		w = nil
	}
	overflow := false
	if w == nil && len(l.sources) >= l.o.MaxSources && now.Sub(l.swept) >= time.Second {
		// A full table is swept at most once a second: a stranger with
		// many addresses must not make each request a walk of the table.
		l.swept = now
		ended = append(ended, l.ended(now)...)
	}
	first := w == nil
	switch {
	case w != nil:
	case len(l.sources) < l.o.MaxSources:
		w = &window{start: now}
		l.sources[src] = w
	default:
		overflow = true
		first = l.overflow == nil
		if first {
			l.overflow = &window{start: now}
		}
		w = l.overflow
	}
	w.count++
	w.last = now
	if len(w.routes) < maxRoutes && !slices.Contains(w.routes, route) {
		w.routes = append(w.routes, route)
	}
	var wait time.Duration
	if !overflow && w.count > l.o.Budget {
		w.limited++
		wait = w.start.Add(l.o.Window).Sub(now)
	}
	l.tracked.Set(float64(len(l.sources)))
	l.mu.Unlock()

	if wait > 0 {
		l.refused.WithLabelValues("rate_limited").Inc()
	} else {
		l.refused.WithLabelValues("unauthorized").Inc()
	}
	l.record(ctx, ended)
	if first && l.o.Audit != nil {
		a := name(src)
		if overflow {
			a = ""
		}
		l.o.Audit.Refused(ctx, audit.Refusal{Address: a, Routes: []string{route}, Count: 1, From: now, To: now})
	}
	return wait
}

// ended removes the windows that ended by now and returns what they
// record. The caller holds mu.
func (l *Limiter) ended(now time.Time) []audit.Refusal {
	var out []audit.Refusal
	for src, w := range l.sources {
		if !now.Before(w.start.Add(l.o.Window)) {
			out = append(out, w.refusal(src))
			delete(l.sources, src)
		}
	}
	if l.overflow != nil && !now.Before(l.overflow.start.Add(l.o.Window)) {
		r := l.overflow.refusal(netip.Prefix{})
		r.Address = "" // the sources past MaxSources
		out = append(out, r)
		l.overflow = nil
	}
	return out
}

// flush records the windows that ended (all of them, when all is set).
func (l *Limiter) flush(all bool) func(context.Context) {
	return func(ctx context.Context) {
		now := l.o.Clock.Now()
		if all {
			now = now.Add(l.o.Window)
		}
		l.mu.Lock()
		ended := l.ended(now)
		l.tracked.Set(float64(len(l.sources)))
		l.mu.Unlock()
		l.record(ctx, ended)
	}
}

// record writes ended windows: those with more than their first refusal,
// which was written as it came.
func (l *Limiter) record(ctx context.Context, ended []audit.Refusal) {
	for _, r := range ended {
		if r.Count < 2 {
			continue
		}
		l.log.Info("requests refused for want of a valid token", "source", r.Address, "count", r.Count,
			"limited", r.Limited, "from", r.From, "to", r.To)
		if l.o.Audit != nil {
			l.o.Audit.Refused(ctx, r)
		}
	}
}

func (w *window) refusal(src netip.Prefix) audit.Refusal {
	return audit.Refusal{Address: name(src), Routes: w.routes, Count: w.count, Limited: w.limited, From: w.start, To: w.last}
}

// name is how a source is written: an address, or a prefix (IPv6 /64).
func name(src netip.Prefix) string {
	if src.Bits() == src.Addr().BitLen() {
		return src.Addr().String()
	}
	return src.String()
}
