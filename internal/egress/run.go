package egress

import (
	"cmp"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/runbox-dev/runbox"
)

// Run is what one run may reach, and what it did.
type Run struct {
	p      *Proxy
	id     string
	record func(runbox.Egress)
	tr     *http.Transport
	ctx    context.Context
	cancel context.CancelFunc
	used   atomic.Int64 // bytes in + out

	mu    sync.Mutex
	grant Patterns
	// secrets are what the run's requests to their domains carry
	// (UseSecrets); secure is the pool those requests go through.
	secrets []Secret
	secure  *http.Transport
	// gen counts the grants; conns holds the open connections by the
	// grant they came under, and served the goroutines serving the
	// current one, so that Allow ends only what came before it.
	gen     int
	conns   map[io.Closer]int
	served  *sync.WaitGroup
	records []runbox.Egress
	// counts are the connections past MaxRecords, by what they have in
	// common; a record each when the run ends.
	counts map[countKey]*runbox.Egress
	taken  int // client connections
	closed bool
}

// Open lets run id reach what grant names until Close; record receives
// each connection as it ends or is refused, up to Settings.MaxRecords of
// them, and then, at Close, one record for each count of the others.
func (p *Proxy) Open(id string, grant Patterns, record func(runbox.Egress)) *Run {
	ctx, cancel := context.WithCancel(context.Background())
	r := &Run{p: p, id: id, record: record, ctx: ctx, cancel: cancel, grant: grant, conns: map[io.Closer]int{},
		served: &sync.WaitGroup{}, counts: map[countKey]*runbox.Egress{}}
	r.tr = &http.Transport{
		DialContext: func(ctx context.Context, _, addr string) (net.Conn, error) {
			host, port, err := net.SplitHostPort(addr)
			n, _ := strconv.ParseUint(port, 10, 16)
			if err != nil || n == 0 {
				return nil, fmt.Errorf("bad address %q", addr)
			}
			return r.connect(ctx, target{host: NormalizeHost(host), port: uint16(n)}, nil)
		},
		// A run cycling through many names keeps at most MaxIdlePerRun
		// of their connections, and the proxy MaxIdle (idleConns).
		MaxIdleConns:          p.s.MaxIdlePerRun,
		MaxIdleConnsPerHost:   min(4, p.s.MaxIdlePerRun),
		ReadBufferSize:        copyBuffer,
		IdleConnTimeout:       p.s.IdleTimeout,
		ResponseHeaderTimeout: p.s.IdleTimeout,
		ExpectContinueTimeout: time.Second,
		// What the program asked for is what it gets, compressed or not.
		DisableCompression: true,
	}
	p.mu.Lock()
	if prev := p.runs[id]; prev != nil {
		defer prev.Close()
	}
	p.runs[id] = r
	p.mu.Unlock()
	return r
}

// Allow replaces what the run may reach from now on (its packages were
// installed, its program starts); connections open under the old grant
// end.
func (r *Run) Allow(grant Patterns) {
	r.mu.Lock()
	r.grant = grant
	gen, served := r.gen, r.served
	r.gen++
	r.served = &sync.WaitGroup{}
	r.mu.Unlock()
	r.endConns(gen)
	r.waitServed(served)
}

// Close ends the run's connections and returns what it recorded: its
// first connections one by one, then a record for each count of the
// others (Egress.Count), which record also receives now.
func (r *Run) Close() []runbox.Egress {
	r.p.mu.Lock()
	if r.p.runs[r.id] == r {
		delete(r.p.runs, r.id)
	}
	r.p.mu.Unlock()
	r.mu.Lock()
	r.closed = true
	gen, served := r.gen, r.served
	r.mu.Unlock()
	r.cancel()
	r.endConns(gen)
	r.tr.CloseIdleConnections()
	r.waitServed(served)
	r.mu.Lock()
	records := slices.Clone(r.records)
	counts := make([]runbox.Egress, 0, len(r.counts))
	for _, c := range r.counts {
		counts = append(counts, *c)
	}
	clear(r.counts)
	r.mu.Unlock()
	slices.SortFunc(counts, func(a, b runbox.Egress) int {
		return cmp.Or(cmp.Compare(b.Count, a.Count), cmp.Compare(a.Host, b.Host), cmp.Compare(a.Port, b.Port),
			cmp.Compare(a.Reason, b.Reason))
	})
	for _, c := range counts {
		r.p.log.Info("egress connections counted", "run", r.id, "host", c.Host, "port", c.Port, "allowed", c.Allowed,
			"reason", c.Reason, "count", c.Count)
		if r.record != nil {
			r.record(c)
		}
	}
	return append(records, counts...)
}

// endConns closes the connections that came under grant gen or before.
func (r *Run) endConns(gen int) {
	r.mu.Lock()
	conns := make([]io.Closer, 0, len(r.conns))
	for c, g := range r.conns {
		if g <= gen {
			conns = append(conns, c)
		}
	}
	r.mu.Unlock()
	for _, c := range conns {
		c.Close()
	}
}

func (r *Run) waitServed(served *sync.WaitGroup) {
	done := make(chan struct{})
	go func() { served.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(closeWait):
		r.p.log.Warn("egress connections did not end in time", "run", r.id)
	}
}

// track keeps c to be closed with the run; false if the run is over.
func (r *Run) track(c io.Closer) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return false
	}
	r.conns[c] = r.gen
	return true
}

func (r *Run) untrack(c io.Closer) {
	r.mu.Lock()
	delete(r.conns, c)
	r.mu.Unlock()
}
