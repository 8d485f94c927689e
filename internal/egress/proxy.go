package egress

import (
	"bufio"
	"cmp"
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/runbox-dev/runbox"
	"github.com/runbox-dev/runbox/internal/lifecycle"
)

// The proxy is an HTTP/1.1 forward proxy (plain requests and CONNECT)
// that serves the connections programs make to their sandbox's proxy
// listener, which reach it through the agent (sandbox.Inbound) with the
// run the sandbox was running. Each run that asked for network is Open
// here with what it may reach; the connections of any other run are
// answered 403. Every request is decided by the name it asks for, before
// anything is dialled: address literals, names outside the run's grant,
// ports other than 80 and 443 (or a mapped name's port), and a Host
// header that differs from the target are refused. An allowed name is
// resolved here (or mapped by SANDBOX_EGRESS_HOSTS) and refused if it
// leads anywhere but a public address; the proxy dials the address it
// checked. Bytes in and out and connections are bounded per run, and
// every connection, made or refused, is recorded.
//
// It is built on net/http's own parts (ReadRequest, Transport, Response)
// rather than a proxy library: net/http drops the Host header of a
// request in absolute form before any handler sees it, and that header
// is one of the things decided here; and everything a library would do
// on its own (dialling, pooling across runs) would have to be overridden.

// Defaults of Settings.
const (
	DefaultMaxBytes       = 512 << 20
	DefaultMaxConnections = 256
	DefaultConnectTimeout = 10 * time.Second
	DefaultIdleTimeout    = 60 * time.Second
	DefaultMaxIdle        = 256
	DefaultMaxIdlePerRun  = 16
)

const (
	// maxHead bounds a request's head.
	maxHead = 16 << 10
	// DefaultMaxRecords is how many of a run's connections are recorded
	// one by one (each an event of the run, an entry of its result's
	// egress list and of the audit log); the rest are counted.
	DefaultMaxRecords = 1000
	// maxCounts bounds the distinct (host, port, outcome, reason) counted
	// past a run's records; any other falls into one count.
	maxCounts = 64
	// ownRefresh is how often the host's own addresses are read again.
	ownRefresh = time.Minute
	// closeWait bounds how long closing a run waits for its connections'
	// records.
	closeWait = 5 * time.Second
	// copyBuffer is what one write towards the program carries: each goes
	// through the Docker Engine to the sandbox as a frame, and fewer,
	// larger ones cost less.
	copyBuffer = 128 << 10
)

// Settings configure a Proxy.
type Settings struct {
	Hosts Hosts
	// Deny are address ranges no connection goes to, beyond those
	// Forbidden names (SANDBOX_EGRESS_DENY_CIDRS): the host's public
	// address in a container, which the proxy cannot see as its own.
	Deny           Ranges
	MaxBytes       int64 // in + out, per run
	MaxConnections int   // per run
	// MaxRecords is how many of a run's connections are recorded one by
	// one; past it, connections are counted per host, port, outcome and
	// reason, and each count is recorded once, when the run ends.
	MaxRecords     int
	ConnectTimeout time.Duration
	IdleTimeout    time.Duration
	// MaxIdle and MaxIdlePerRun bound the upstream connections kept idle
	// for reuse, in all and per run; past them the oldest is closed.
	MaxIdle, MaxIdlePerRun int
	// CA signs the certificates of the secrets' domains (mitm.go); nil
	// when there are no secrets.
	CA *CA
	// UpstreamRoots verify the servers of the secrets' domains (the
	// system's roots if nil).
	UpstreamRoots *x509.CertPool
	// Resolver resolves names (net.DefaultResolver if nil).
	Resolver Resolver
	// Clock drives the refresh of the host's addresses.
	Clock  clockwork.Clock
	Logger *slog.Logger
}

// Proxy is the egress proxy of an executor.
type Proxy struct {
	lifecycle.Base
	s    Settings
	log  *slog.Logger
	own  atomic.Pointer[map[netip.Addr]bool]
	idle *idleConns

	mu   sync.Mutex
	runs map[string]*Run
}

// New returns a Proxy; Start it.
func New(s Settings) *Proxy {
	s.MaxBytes = cmp.Or(s.MaxBytes, DefaultMaxBytes)
	s.MaxConnections = cmp.Or(s.MaxConnections, DefaultMaxConnections)
	s.MaxRecords = cmp.Or(s.MaxRecords, DefaultMaxRecords)
	s.ConnectTimeout = cmp.Or(s.ConnectTimeout, DefaultConnectTimeout)
	s.IdleTimeout = cmp.Or(s.IdleTimeout, DefaultIdleTimeout)
	s.MaxIdle = cmp.Or(s.MaxIdle, DefaultMaxIdle)
	s.MaxIdlePerRun = cmp.Or(s.MaxIdlePerRun, DefaultMaxIdlePerRun)
	if s.Resolver == nil {
		s.Resolver = net.DefaultResolver
	}
	if s.Clock == nil {
		s.Clock = clockwork.NewRealClock()
	}
	log := s.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	p := &Proxy{s: s, log: log.With("component", "egress"), runs: map[string]*Run{}, idle: &idleConns{max: s.MaxIdle}}
	p.refreshOwn()
	return p
}

// Start keeps the host's own addresses current (a name must not lead to
// them), until Stop.
func (p *Proxy) Start(ctx context.Context) error {
	p.refreshOwn()
	return p.Base.Run(ctx, lifecycle.Every(p.s.Clock, ownRefresh, func(context.Context) { p.refreshOwn() }))
}

// Stop ends the refresh and every run's connections.
func (p *Proxy) Stop() {
	p.Base.Stop()
	p.mu.Lock()
	runs := make([]*Run, 0, len(p.runs))
	for _, r := range p.runs {
		runs = append(runs, r)
	}
	p.mu.Unlock()
	for _, r := range runs {
		r.Close()
	}
}

func (p *Proxy) refreshOwn() {
	own, err := OwnAddresses()
	if err != nil {
		p.log.Warn("read the host's addresses", "err", err)
	}
	if err != nil && p.own.Load() != nil {
		return // keep what was read last
	}
	p.own.Store(&own)
}

// Serve handles a connection a program of run id made to its proxy
// listener. It returns at once; the proxy owns c.
func (p *Proxy) Serve(id string, c net.Conn) {
	p.mu.Lock()
	r := p.runs[id]
	p.mu.Unlock()
	if r == nil || !r.track(c) {
		go refuseRun(c, p.s.IdleTimeout)
		return
	}
	r.mu.Lock()
	r.taken++
	over := r.taken > r.p.s.MaxConnections
	served := r.served
	served.Add(1)
	r.mu.Unlock()
	go r.serve(c, over, served)
}

// refuseRun answers a connection of a run that asked for no network.
func refuseRun(c net.Conn, idle time.Duration) {
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(min(idle, 10*time.Second)))
	br := bufio.NewReaderSize(c, maxHead)
	if _, err := http.ReadRequest(br); err != nil {
		return
	}
	writeRefusal(c, http.StatusForbidden, "this run asked for no network: pass network.allowed_domains (within this client's allowlist)")
}

// target is what a request asks to reach.
type target struct {
	host string // as NormalizeHost leaves it
	port uint16
}

// serve reads requests from a program's connection until it closes, a
// tunnel ends it, or a request is refused.
func (r *Run) serve(c net.Conn, over bool, served *sync.WaitGroup) {
	defer served.Done()
	idle := newActivity(r.p.s.IdleTimeout)
	idle.add(c)
	defer idle.stop()
	defer r.untrack(c)
	defer c.Close()
	cc := &activeConn{Conn: c, act: idle}
	br := bufio.NewReaderSize(cc, maxHead)
	for {
		line, hosts, err := readHead(br)
		if err != nil {
			if errors.Is(err, errHeadTooLarge) || errors.Is(err, errFolded) {
				r.add(runbox.Egress{Host: lineHost(line), Reason: err.Error()})
				writeRefusal(cc, http.StatusBadRequest, err.Error())
			}
			return
		}
		req, err := http.ReadRequest(br)
		if err != nil {
			reason, status := "a malformed request", http.StatusBadRequest
			if len(hosts) > 1 {
				reason, status = "more than one Host header", http.StatusForbidden
			}
			r.add(runbox.Egress{Host: lineHost(line), Reason: reason})
			writeRefusal(cc, status, reason)
			return
		}
		t, raw, reason := requestTarget(req, hosts)
		if reason == "" && over {
			reason = fmt.Sprintf("the run's limit of %d connections is reached", r.p.s.MaxConnections)
		}
		if reason == "" {
			reason = r.precheck(t)
		}
		if reason != "" {
			r.add(runbox.Egress{Host: raw, Port: int(t.port), Reason: reason})
			writeRefusal(cc, http.StatusForbidden, reason)
			return
		}
		if req.Method == http.MethodConnect {
			if ss := r.secretsFor(t.host); len(ss) > 0 {
				r.intercept(cc, br, t, ss)
				return
			}
			r.tunnel(cc, br, t, idle)
			return
		}
		if !r.forward(cc, req, t) {
			return
		}
	}
}

// precheck decides what needs no resolution: the name's form, the run's
// grant, the port.
func (r *Run) precheck(t target) string {
	if _, err := netip.ParseAddr(t.host); err == nil {
		return "an address literal: requests must name the host"
	}
	if !IsHostName(t.host) {
		return "not a host name"
	}
	r.mu.Lock()
	allowed := r.grant.Match(t.host)
	r.mu.Unlock()
	if !allowed {
		return "not among this run's network.allowed_domains"
	}
	if m, ok := r.p.s.Hosts[t.host]; ok {
		if !m.Allows(t.port) {
			return fmt.Sprintf("port %d is not the port SANDBOX_EGRESS_HOSTS gives this name", t.port)
		}
		return ""
	}
	if t.port != 80 && t.port != 443 {
		return fmt.Sprintf("port %d: names resolved through DNS are reached on ports 80 and 443 only", t.port)
	}
	return ""
}

// writeRefusal answers a request the proxy will not carry, and says why.
func writeRefusal(w io.Writer, status int, reason string) {
	body := "runbox egress: " + reason + "\n"
	fmt.Fprintf(w, "HTTP/1.1 %d %s\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: %d\r\n"+
		"Connection: close\r\nX-Runbox-Egress: refused\r\n\r\n%s", status, http.StatusText(status), len(body), body)
}
