package egress

import (
	"bufio"
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
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
)

const (
	// maxHead bounds a request's head.
	maxHead = 16 << 10
	// maxRecords bounds the connections a run's result lists.
	maxRecords = 1000
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

// Resolver resolves names; *net.Resolver is one.
type Resolver interface {
	LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error)
}

// Settings configure a Proxy.
type Settings struct {
	Hosts          Hosts
	MaxBytes       int64 // in + out, per run
	MaxConnections int   // per run
	ConnectTimeout time.Duration
	IdleTimeout    time.Duration
	// Resolver resolves names (net.DefaultResolver if nil).
	Resolver Resolver
	// Clock drives the refresh of the host's addresses.
	Clock  clockwork.Clock
	Logger *slog.Logger
}

// Proxy is the egress proxy of an executor.
type Proxy struct {
	lifecycle.Base
	s   Settings
	log *slog.Logger
	own atomic.Pointer[map[netip.Addr]bool]

	mu   sync.Mutex
	runs map[string]*Run
}

// New returns a Proxy; Start it.
func New(s Settings) *Proxy {
	s.MaxBytes = cmp.Or(s.MaxBytes, DefaultMaxBytes)
	s.MaxConnections = cmp.Or(s.MaxConnections, DefaultMaxConnections)
	s.ConnectTimeout = cmp.Or(s.ConnectTimeout, DefaultConnectTimeout)
	s.IdleTimeout = cmp.Or(s.IdleTimeout, DefaultIdleTimeout)
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
	p := &Proxy{s: s, log: log.With("component", "egress"), runs: map[string]*Run{}}
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
	own := map[netip.Addr]bool{}
	addrs, err := net.InterfaceAddrs()
	if err != nil {
		p.log.Warn("read the host's addresses", "err", err)
	}
	for _, a := range addrs {
		if pfx, err := netip.ParsePrefix(a.String()); err == nil {
			own[pfx.Addr().Unmap().WithZone("")] = true
		}
	}
	if err != nil && p.own.Load() != nil {
		return // keep what was read last
	}
	p.own.Store(&own)
}

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
	// gen counts the grants; conns holds the open connections by the
	// grant they came under, and served the goroutines serving the
	// current one, so that Allow ends only what came before it.
	gen     int
	conns   map[io.Closer]int
	served  *sync.WaitGroup
	records []runbox.Egress
	dropped int
	taken   int // client connections
	closed  bool
}

// Open lets run id reach what grant names until Close; record receives
// each connection as it ends or is refused.
func (p *Proxy) Open(id string, grant Patterns, record func(runbox.Egress)) *Run {
	ctx, cancel := context.WithCancel(context.Background())
	r := &Run{p: p, id: id, record: record, ctx: ctx, cancel: cancel, grant: grant, conns: map[io.Closer]int{},
		served: &sync.WaitGroup{}}
	r.tr = &http.Transport{
		DialContext: func(ctx context.Context, _, addr string) (net.Conn, error) {
			host, port, err := net.SplitHostPort(addr)
			n, _ := strconv.ParseUint(port, 10, 16)
			if err != nil || n == 0 {
				return nil, fmt.Errorf("bad address %q", addr)
			}
			return r.connect(ctx, target{host: NormalizeHost(host), port: uint16(n)}, nil)
		},
		MaxIdleConnsPerHost:   4,
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

// Close ends the run's connections and returns what it recorded. Later
// connections of the run are refused.
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
	defer r.mu.Unlock()
	if r.dropped > 0 {
		r.p.log.Info("egress connections beyond the result's list", "run", r.id, "count", r.dropped)
	}
	return append([]runbox.Egress(nil), r.records...)
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

// add records a connection.
func (r *Run) add(e runbox.Egress) {
	r.mu.Lock()
	if len(r.records) < maxRecords {
		r.records = append(r.records, e)
	} else {
		r.dropped++
	}
	r.mu.Unlock()
	r.p.log.Debug("egress", "run", r.id, "host", e.Host, "port", e.Port, "allowed", e.Allowed, "reason", e.Reason,
		"bytes_in", e.BytesIn, "bytes_out", e.BytesOut)
	if r.record != nil {
		r.record(e)
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

// refusal is a connection the policy refused after resolving its name.
type refusal struct{ reason string }

func (e *refusal) Error() string { return e.reason }

// connect resolves t (or maps it), checks every address, and dials one,
// counting what goes through against the run's bounds. act, if set, is
// the activity of the program's connection the result is tunnelled to.
func (r *Run) connect(ctx context.Context, t target, act *activity) (net.Conn, error) {
	rec := runbox.Egress{Host: t.host, Port: int(t.port)}
	addrs, reason := r.resolve(ctx, t)
	if reason != "" {
		rec.Reason = reason
		r.add(rec)
		return nil, &refusal{reason}
	}
	rec.Allowed = true
	d := net.Dialer{Timeout: r.p.s.ConnectTimeout}
	var err error
	for _, a := range addrs {
		var c net.Conn
		if c, err = d.DialContext(ctx, "tcp", a.String()); err == nil {
			u := &upstream{Conn: c, r: r, rec: rec, act: act}
			if act == nil {
				u.act, u.own = newActivity(r.p.s.IdleTimeout), true
			}
			u.act.add(u)
			if !r.track(u) {
				u.Close()
				return nil, net.ErrClosed
			}
			return u, nil
		}
	}
	rec.Reason = "could not connect: " + dialError(err)
	r.add(rec)
	return nil, err
}

// resolve returns the addresses t may be dialled at, or why none.
func (r *Run) resolve(ctx context.Context, t target) ([]netip.AddrPort, string) {
	if m, ok := r.p.s.Hosts[t.host]; ok {
		return []netip.AddrPort{netip.AddrPortFrom(m.Addr, t.port)}, ""
	}
	rctx, cancel := context.WithTimeout(ctx, r.p.s.ConnectTimeout)
	defer cancel()
	ips, err := r.p.s.Resolver.LookupNetIP(rctx, "ip", t.host)
	if err != nil || len(ips) == 0 {
		return nil, "the name does not resolve"
	}
	own := *r.p.own.Load()
	out := make([]netip.AddrPort, 0, len(ips))
	for _, ip := range ips {
		// One address it may not lead to refuses the name: its owner
		// decides what it resolves to, and when.
		if why := Forbidden(ip, own); why != "" {
			return nil, "the name resolves to " + why
		}
		out = append(out, netip.AddrPortFrom(ip.Unmap(), t.port))
	}
	return out, ""
}

func dialError(err error) string {
	var ne net.Error
	switch {
	case err == nil:
		return "no address"
	case errors.As(err, &ne) && ne.Timeout():
		return "timed out"
	case strings.Contains(err.Error(), "refused"):
		return "connection refused"
	}
	return "network error"
}

// tunnel serves a CONNECT: the program's bytes go to the target and back
// until either side ends.
func (r *Run) tunnel(c net.Conn, br *bufio.Reader, t target, act *activity) {
	up, err := r.connect(r.ctx, t, act)
	if err != nil {
		var ref *refusal
		if errors.As(err, &ref) {
			writeRefusal(c, http.StatusForbidden, ref.reason)
		} else {
			writeRefusal(c, http.StatusBadGateway, "could not connect to "+t.host)
		}
		return
	}
	defer up.Close()
	if _, err := io.WriteString(c, "HTTP/1.1 200 Connection established\r\n\r\n"); err != nil {
		return
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		// What the program sent, bytes it sent after the head first.
		if _, err := io.Copy(up, br); err != nil {
			up.Close()
		} else if cw, ok := up.(*upstream).Conn.(closeWriter); ok {
			_ = cw.CloseWrite()
		}
	}()
	_, _ = io.CopyBuffer(c, up, make([]byte, copyBuffer))
	c.Close() // ends the other direction too
	<-done
}

// closeWriter is a connection whose sending side can be closed alone.
type closeWriter interface{ CloseWrite() error }

// hopByHop are the headers of one connection, never forwarded.
var hopByHop = []string{"Connection", "Proxy-Connection", "Keep-Alive", "Proxy-Authenticate", "Proxy-Authorization",
	"Te", "Trailer", "Transfer-Encoding", "Upgrade"}

func removeHopByHop(h http.Header) {
	for _, f := range h.Values("Connection") {
		for name := range strings.SplitSeq(f, ",") {
			h.Del(strings.TrimSpace(name))
		}
	}
	for _, name := range hopByHop {
		h.Del(name)
	}
}

// forward sends a plain request on and its response back; it reports
// whether the program's connection may carry another request.
func (r *Run) forward(c net.Conn, req *http.Request, t target) bool {
	body := &trackedBody{ReadCloser: req.Body}
	out := req.Clone(r.ctx)
	out.Body, out.RequestURI, out.Host = body, "", ""
	if req.ContentLength == 0 {
		out.Body = http.NoBody
		body.eof = true
	}
	removeHopByHop(out.Header)
	// Whether the program's connection is kept is the program's say; the
	// upstream one is pooled for the run's next request, on this
	// connection or another (urllib sends "Connection: close" with every
	// request, and a new dial each cost more than the whole request).
	out.Close = false
	resp, err := r.tr.RoundTrip(out)
	if err != nil {
		var ref *refusal
		if errors.As(err, &ref) {
			writeRefusal(c, http.StatusForbidden, ref.reason)
		} else {
			writeRefusal(c, http.StatusBadGateway, "could not reach "+t.host+": "+dialError(err))
		}
		return false
	}
	removeHopByHop(resp.Header)
	keep := !req.Close && !resp.Close
	resp.Close = !keep // the program is told
	w := bufio.NewWriterSize(c, copyBuffer)
	if err := resp.Write(w); err != nil || w.Flush() != nil {
		return false
	}
	return keep && body.eof
}

// trackedBody says whether a request's body was read to its end, so that
// the next request on the connection starts where it should.
type trackedBody struct {
	io.ReadCloser
	eof bool
}

func (b *trackedBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if errors.Is(err, io.EOF) {
		b.eof = true
	}
	return n, err
}

var errHeadTooLarge = errors.New("the request's head is too large")

// readHead waits for a request's whole head in br, without consuming it,
// and returns its request line and the values of its Host headers:
// net/http drops the header of a request in absolute form.
func readHead(br *bufio.Reader) (string, []string, error) {
	if _, err := br.Peek(1); err != nil {
		return "", nil, err
	}
	for {
		buf, _ := br.Peek(br.Buffered())
		if end := headEnd(buf); end >= 0 {
			return parseHead(buf[:end])
		}
		if br.Buffered() >= maxHead {
			line, _, _ := bytes.Cut(buf, []byte("\n"))
			return string(line), nil, errHeadTooLarge
		}
		if _, err := br.Peek(br.Buffered() + 1); err != nil {
			return "", nil, err
		}
	}
}

// lineHost returns the host a request line names, as far as it can be
// told, for the record of a request refused before it was parsed.
func lineHost(line string) string {
	fields := strings.Fields(line)
	if len(fields) < 2 {
		return ""
	}
	if u, err := url.Parse(fields[1]); err == nil && u.Host != "" {
		return cut(u.Hostname())
	}
	if h, _, err := net.SplitHostPort(fields[1]); err == nil {
		return cut(h)
	}
	return ""
}

// headEnd returns where the blank line ending a head starts, or -1.
func headEnd(b []byte) int {
	end := -1
	for _, sep := range [][]byte{[]byte("\n\r\n"), []byte("\n\n")} {
		if i := bytes.Index(b, sep); i >= 0 && (end < 0 || i < end) {
			end = i
		}
	}
	return end
}

var errFolded = errors.New("a folded header line")

func parseHead(head []byte) (string, []string, error) {
	var hosts []string
	lines := strings.Split(string(head), "\n")
	first := strings.TrimSuffix(lines[0], "\r")
	for _, line := range lines[1:] {
		line = strings.TrimSuffix(line, "\r")
		if line != "" && (line[0] == ' ' || line[0] == '\t') {
			return first, nil, errFolded
		}
		if name, value, ok := strings.Cut(line, ":"); ok && strings.EqualFold(name, "host") {
			hosts = append(hosts, strings.TrimSpace(value))
		}
	}
	return first, hosts, nil
}

// requestTarget returns what a request asks for, the host as it was
// written (for the record), and why it is refused, if it is.
func requestTarget(req *http.Request, hosts []string) (target, string, string) {
	var host, port string
	defPort := "80"
	switch {
	case req.ProtoMajor != 1:
		return target{}, "", "only HTTP/1.x is proxied"
	case req.Method == http.MethodConnect:
		var err error
		if host, port, err = net.SplitHostPort(req.RequestURI); err != nil {
			return target{}, cut(req.RequestURI), "CONNECT names host:port"
		}
		defPort = port
	case req.URL.Host == "":
		return target{}, "", "requests through the proxy name their target in full (http://host/…)"
	case req.URL.Scheme != "http":
		return target{}, cut(req.URL.Host), "only http:// requests are forwarded; https goes through CONNECT"
	default:
		host, port = req.URL.Hostname(), cmp.Or(req.URL.Port(), "80")
	}
	n, err := strconv.ParseUint(port, 10, 16)
	t := target{host: NormalizeHost(host), port: uint16(n)}
	raw := cut(host)
	switch {
	case t.host == "":
		return t, raw, "no host"
	case err != nil || n == 0:
		return t, raw, "a bad port"
	case len(hosts) == 1 && !sameAuthority(hosts[0], t, defPort):
		return t, raw, fmt.Sprintf("the Host header names %q, not the request's target", cut(hosts[0]))
	}
	return t, raw, ""
}

// sameAuthority reports whether a Host header names t (a header without a
// port names defPort).
func sameAuthority(h string, t target, defPort string) bool {
	host, port, err := net.SplitHostPort(h)
	if err != nil {
		host, port = h, defPort
	}
	return NormalizeHost(host) == t.host && port == strconv.Itoa(int(t.port))
}

func cut(s string) string {
	if len(s) > 255 {
		return s[:255]
	}
	return s
}

// writeRefusal answers a request the proxy will not carry, and says why.
func writeRefusal(w io.Writer, status int, reason string) {
	body := "runbox egress: " + reason + "\n"
	fmt.Fprintf(w, "HTTP/1.1 %d %s\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: %d\r\n"+
		"Connection: close\r\nX-Runbox-Egress: refused\r\n\r\n%s", status, http.StatusText(status), len(body), body)
}

// activity closes connections that moved no byte, either way, for idle:
// a program's connection and what it is tunnelled to end together.
type activity struct {
	t       *time.Timer
	idle    time.Duration
	mu      sync.Mutex
	closers []io.Closer
}

func newActivity(idle time.Duration) *activity {
	a := &activity{idle: idle}
	a.t = time.AfterFunc(idle, a.fire)
	return a
}

func (a *activity) add(c io.Closer) {
	a.mu.Lock()
	a.closers = append(a.closers, c)
	a.mu.Unlock()
}

func (a *activity) fire() {
	a.mu.Lock()
	closers := a.closers
	a.mu.Unlock()
	for _, c := range closers {
		c.Close()
	}
}

func (a *activity) touch() { a.t.Reset(a.idle) }
func (a *activity) stop()  { a.t.Stop() }

// activeConn is a program's connection, whose every read and write
// counts as activity.
type activeConn struct {
	net.Conn
	act *activity
}

func (c *activeConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.act.touch()
	return n, err
}

func (c *activeConn) Write(p []byte) (int, error) {
	n, err := c.Conn.Write(p)
	c.act.touch()
	return n, err
}

// upstream is a connection the proxy dialled for a run: what crosses it
// counts against the run's bytes, and it is recorded once closed.
type upstream struct {
	net.Conn
	r    *Run
	act  *activity
	own  bool // act is this connection's own
	once sync.Once

	mu  sync.Mutex
	rec runbox.Egress
}

func (u *upstream) Read(p []byte) (int, error) {
	n, err := u.Conn.Read(p)
	u.count(int64(n), 0)
	return n, err
}

// Write counts p before it goes: past the run's bytes it does not, and
// a Close that races the write's return still records it.
func (u *upstream) Write(p []byte) (int, error) {
	if u.count(0, int64(len(p))) {
		return 0, net.ErrClosed
	}
	return u.Conn.Write(p)
}

// count adds what crossed; past the run's bytes, the connection is cut,
// and count says so.
func (u *upstream) count(in, out int64) bool {
	if in+out == 0 {
		return false
	}
	u.act.touch()
	u.mu.Lock()
	u.rec.BytesIn += in
	u.rec.BytesOut += out
	u.mu.Unlock()
	if u.r.used.Add(in+out) > u.r.p.s.MaxBytes {
		u.mu.Lock()
		u.rec.Reason = fmt.Sprintf("cut at the run's limit of %d bytes", u.r.p.s.MaxBytes)
		u.mu.Unlock()
		u.Conn.Close()
		return true
	}
	return false
}

func (u *upstream) Close() error {
	err := u.Conn.Close()
	u.once.Do(func() {
		if u.own {
			u.act.stop()
		}
		u.r.untrack(u)
		u.mu.Lock()
		rec := u.rec
		u.mu.Unlock()
		u.r.add(rec)
	})
	return err
}
