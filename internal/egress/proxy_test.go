package egress

import (
	"bufio"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/runbox-dev/runbox"
)

// fixture is a proxy with real servers on loopback behind mapped names:
// files.test (plain HTTP), tls.test (HTTPS), silent.test (accepts and
// says nothing) and other.test (the plain one again, never granted).
type fixture struct {
	p       *Proxy
	proxy   string // address of the listener standing in for the agent
	run     string
	files   int
	tls     int
	silent  int
	mu      sync.Mutex
	records []runbox.Egress
}

func newFixture(t testing.TB, change func(*Settings)) *fixture {
	t.Helper()
	f := &fixture{run: "run-1"}
	mux := http.NewServeMux()
	mux.HandleFunc("/hello", func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "hello "+r.Host) })
	mux.HandleFunc("/big", func(w http.ResponseWriter, r *http.Request) {
		n, _ := strconv.Atoi(r.URL.Query().Get("n"))
		w.Header().Set("Content-Length", strconv.Itoa(n))
		chunk := make([]byte, 32<<10)
		for n > 0 {
			k := min(n, len(chunk))
			if _, err := w.Write(chunk[:k]); err != nil {
				return
			}
			n -= k
		}
	})
	plain := httptest.NewServer(mux)
	t.Cleanup(plain.Close)
	secure := httptest.NewTLSServer(mux)
	t.Cleanup(secure.Close)
	f.files, f.tls = port(t, plain.URL), port(t, secure.URL)
	silent, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { silent.Close() })
	go func() {
		for {
			c, err := silent.Accept()
			if err != nil {
				return
			}
			t.Cleanup(func() { c.Close() })
		}
	}()
	f.silent = silent.Addr().(*net.TCPAddr).Port
	lo := netip.MustParseAddr("127.0.0.1")
	s := Settings{Hosts: Hosts{
		"files.test":  {lo, uint16(f.files)},
		"tls.test":    {lo, uint16(f.tls)},
		"silent.test": {lo, uint16(f.silent)},
		"other.test":  {lo, uint16(f.files)},
	}}
	if change != nil {
		change(&s)
	}
	f.p = New(s)
	if err := f.p.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(f.p.Stop)
	// As the agent and the sandbox hand connections over: each one to
	// Serve with the run the sandbox runs.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			f.mu.Lock()
			run := f.run
			f.mu.Unlock()
			f.p.Serve(run, c)
		}
	}()
	f.proxy = ln.Addr().String()
	return f
}

// freePort returns a port nothing listens on (testenv's, which this
// package cannot import: testenv reads the configuration, which reads it).
func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

func port(t testing.TB, u string) int {
	t.Helper()
	pu, err := url.Parse(u)
	if err != nil {
		t.Fatal(err)
	}
	n, _ := strconv.Atoi(pu.Port())
	return n
}

func (f *fixture) open(grant ...string) *Run {
	g, err := ParsePatterns(grant)
	if err != nil {
		panic(err)
	}
	return f.p.Open(f.run, g, func(e runbox.Egress) {
		f.mu.Lock()
		f.records = append(f.records, e)
		f.mu.Unlock()
	})
}

func (f *fixture) client() *http.Client {
	return &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{
		Proxy:           http.ProxyURL(&url.URL{Scheme: "http", Host: f.proxy}),
		TLSClientConfig: &tls.Config{InsecureSkipVerify: true},
	}}
}

// raw sends a request as written and returns the status and body.
func (f *fixture) raw(t *testing.T, request string) (int, string) {
	t.Helper()
	c, err := net.Dial("tcp", f.proxy)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(30 * time.Second))
	if _, err := io.WriteString(c, request); err != nil {
		t.Fatal(err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatalf("%q: %v", request, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func TestProxyAllows(t *testing.T) {
	f := newFixture(t, nil)
	r := f.open("files.test", "tls.test")
	c := f.client()
	for _, u := range []string{
		fmt.Sprintf("http://files.test:%d/hello", f.files),
		fmt.Sprintf("http://files.test:%d/hello", f.files), // again, on the kept connection
		fmt.Sprintf("https://tls.test:%d/hello", f.tls),
	} {
		resp, err := c.Get(u)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != 200 || !strings.HasPrefix(string(b), "hello ") {
			t.Fatalf("%s: %d %q", u, resp.StatusCode, b)
		}
	}
	c.CloseIdleConnections()
	recs := r.Close()
	hosts := map[string]int{}
	for _, e := range recs {
		if !e.Allowed || e.Reason != "" || e.BytesIn == 0 || e.BytesOut == 0 {
			t.Errorf("record %+v", e)
		}
		hosts[e.Host]++
	}
	if hosts["files.test"] != 1 || hosts["tls.test"] != 1 {
		t.Errorf("records %+v: want one connection to each", recs)
	}
}

func TestProxyRefuses(t *testing.T) {
	f := newFixture(t, nil)
	redis := freePort(t)
	for _, tt := range []struct {
		name, request, host, reason string
	}{
		{"a name not asked for", fmt.Sprintf("GET http://other.test:%d/hello HTTP/1.1\r\nHost: other.test:%[1]d\r\n\r\n", f.files),
			"other.test", "not among this run's network.allowed_domains"},
		{"an IPv4 literal", fmt.Sprintf("GET http://127.0.0.1:%d/hello HTTP/1.1\r\n\r\n", f.files), "127.0.0.1", "address literal"},
		{"an IPv6 literal", fmt.Sprintf("GET http://[::1]:%d/hello HTTP/1.1\r\n\r\n", f.files), "::1", "address literal"},
		{"an address as a number", "GET http://2130706433/ HTTP/1.1\r\n\r\n", "2130706433", "not a host name"},
		{"a name resolving to 127.0.0.1 without a mapping", "GET http://localhost/ HTTP/1.1\r\nHost: localhost\r\n\r\n",
			"localhost", "resolves to a loopback address"},
		{"the Redis port of a mapped name", fmt.Sprintf("GET http://files.test:%d/ HTTP/1.1\r\n\r\n", redis), "files.test",
			fmt.Sprintf("port %d is not the port", redis)},
		{"a port other than 80 and 443", "GET http://localhost:8080/ HTTP/1.1\r\n\r\n", "localhost", "ports 80 and 443 only"},
		{"a CONNECT to a name not asked for", "CONNECT other.test:443 HTTP/1.1\r\nHost: other.test:443\r\n\r\n",
			"other.test", "not among"},
		{"a CONNECT to an address", "CONNECT 127.0.0.1:443 HTTP/1.1\r\n\r\n", "127.0.0.1", "address literal"},
		{"a Host header differing from the request line", fmt.Sprintf("GET http://files.test:%d/hello HTTP/1.1\r\nHost: other.test\r\n\r\n", f.files),
			"files.test", `the Host header names "other.test"`},
		{"a Host header differing from the CONNECT target", fmt.Sprintf("CONNECT files.test:%d HTTP/1.1\r\nHost: redis.internal:6379\r\n\r\n", f.files),
			"files.test", "the Host header names"},
		{"two Host headers", fmt.Sprintf("GET http://files.test:%d/ HTTP/1.1\r\nHost: files.test:%[1]d\r\nHost: other.test\r\n\r\n", f.files),
			"files.test", "more than one Host header"},
		{"a request without its target", "GET /hello HTTP/1.1\r\nHost: files.test\r\n\r\n", "", "name their target in full"},
		{"https in a plain request", "GET https://files.test/ HTTP/1.1\r\n\r\n", "files.test", "only http://"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			r := f.open("files.test", "localhost")
			status, body := f.raw(t, tt.request)
			recs := r.Close()
			if status != http.StatusForbidden || !strings.Contains(body, tt.reason) {
				t.Errorf("answer %d %q, want 403 saying %q", status, body, tt.reason)
			}
			if len(recs) != 1 || recs[0].Allowed || recs[0].Host != tt.host || !strings.Contains(recs[0].Reason, tt.reason) {
				t.Errorf("records %+v, want one refusal of %q", recs, tt.host)
			}
		})
	}
}

func TestProxyRefusesRunsWithoutNetwork(t *testing.T) {
	f := newFixture(t, nil)
	status, body := f.raw(t, fmt.Sprintf("GET http://files.test:%d/hello HTTP/1.1\r\n\r\n", f.files))
	if status != http.StatusForbidden || !strings.Contains(body, "asked for no network") {
		t.Errorf("%d %q", status, body)
	}
	// Nor once a run is closed.
	f.open("files.test").Close()
	if status, _ := f.raw(t, fmt.Sprintf("GET http://files.test:%d/hello HTTP/1.1\r\n\r\n", f.files)); status != http.StatusForbidden {
		t.Errorf("a closed run's connection: %d", status)
	}
}

func TestProxyByteLimitCuts(t *testing.T) {
	f := newFixture(t, func(s *Settings) { s.MaxBytes = 1 << 20 })
	for _, scheme := range []string{"http", "https"} {
		t.Run(scheme, func(t *testing.T) {
			r := f.open("files.test", "tls.test")
			u := fmt.Sprintf("http://files.test:%d/big?n=%d", f.files, 8<<20)
			if scheme == "https" {
				u = fmt.Sprintf("https://tls.test:%d/big?n=%d", f.tls, 8<<20)
			}
			resp, err := f.client().Get(u)
			got := int64(0)
			if err == nil {
				got, err = io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
			if err == nil || got >= 8<<20 {
				t.Errorf("read %d bytes, err %v: want the download cut", got, err)
			}
			recs := r.Close()
			if len(recs) != 1 || !strings.Contains(recs[0].Reason, "cut at the run's limit") || recs[0].BytesIn > 2<<20 {
				t.Errorf("records %+v", recs)
			}
		})
	}
}

func TestProxyConnectionLimit(t *testing.T) {
	f := newFixture(t, func(s *Settings) { s.MaxConnections = 2 })
	r := f.open("files.test")
	req := fmt.Sprintf("GET http://files.test:%d/hello HTTP/1.1\r\nConnection: close\r\n\r\n", f.files)
	for i, want := range []int{200, 200, 403} {
		if status, body := f.raw(t, req); status != want {
			t.Errorf("connection %d: %d %q, want %d", i+1, status, body, want)
		}
	}
	recs := r.Close()
	refused, allowed := 0, 0
	for _, e := range recs {
		if !e.Allowed && strings.Contains(e.Reason, "limit of 2 connections") {
			refused++
		}
		if e.Allowed {
			allowed++
		}
	}
	// The second request may go over the first one's upstream connection,
	// pooled for the run: records are of connections runbox made.
	if allowed < 1 || allowed > 2 || refused != 1 {
		t.Errorf("records %+v, want one or two connections and one refusal", recs)
	}
}

// dialTunnel opens a CONNECT tunnel to host:port through the proxy.
func (f *fixture) dialTunnel(t *testing.T, host string, port int) (net.Conn, *bufio.Reader) {
	t.Helper()
	c, err := net.Dial("tcp", f.proxy)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	fmt.Fprintf(c, "CONNECT %s:%d HTTP/1.1\r\nHost: %[1]s:%[2]d\r\n\r\n", host, port)
	br := bufio.NewReader(c)
	resp, err := http.ReadResponse(br, &http.Request{Method: http.MethodConnect})
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("CONNECT: %v %v", resp, err)
	}
	return c, br
}

func TestProxyCloseEndsConnections(t *testing.T) {
	f := newFixture(t, nil)
	r := f.open("silent.test")
	c, br := f.dialTunnel(t, "silent.test", f.silent)
	recs := r.Close()
	c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := br.ReadByte(); err == nil {
		t.Error("a tunnel outlived its run")
	}
	if len(recs) != 1 || !recs[0].Allowed || recs[0].Host != "silent.test" {
		t.Errorf("records %+v", recs)
	}
}

func TestProxyIdleTimeout(t *testing.T) {
	f := newFixture(t, func(s *Settings) { s.IdleTimeout = 200 * time.Millisecond })
	r := f.open("silent.test")
	defer r.Close()
	c, br := f.dialTunnel(t, "silent.test", f.silent)
	c.SetDeadline(time.Now().Add(30 * time.Second))
	if _, err := br.ReadByte(); err == nil || isTimeout(err) {
		t.Errorf("an idle tunnel was not ended: %v", err)
	}
}

func isTimeout(err error) bool {
	ne, ok := err.(net.Error)
	return ok && ne.Timeout()
}

func TestProxyAllowReplacesTheGrant(t *testing.T) {
	f := newFixture(t, nil)
	r := f.open("files.test")
	defer r.Close()
	get := func(host string) int {
		status, _ := f.raw(t, fmt.Sprintf("GET http://%s:%d/hello HTTP/1.1\r\nConnection: close\r\n\r\n", host, f.files))
		return status
	}
	if get("files.test") != 200 || get("other.test") != 403 {
		t.Fatal("before")
	}
	c, br := f.dialTunnel(t, "files.test", f.files) // open under the old grant
	g, _ := ParsePatterns([]string{"other.test"})
	r.Allow(g)
	c.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := br.ReadByte(); err == nil {
		t.Error("a connection of the old grant lives on")
	}
	if get("files.test") != 403 || get("other.test") != 200 {
		t.Fatal("after")
	}
}

// FuzzRequestHead: what a program sends the proxy is read as a head, a
// request and a target without a panic, and a target passes only with a
// host and a port.
func FuzzRequestHead(f *testing.F) {
	f.Add([]byte("GET http://files.test:8080/x HTTP/1.1\r\nHost: files.test:8080\r\n\r\n"))
	f.Add([]byte("CONNECT files.test:443 HTTP/1.1\r\nHost: files.test:443\r\n\r\n"))
	f.Add([]byte("GET http://a.test/ HTTP/1.1\nHost: b.test\n\n"))
	f.Add([]byte("GET http://[::1]:80/ HTTP/1.1\r\nHost: a\r\n folded\r\n\r\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		br := bufio.NewReaderSize(strings.NewReader(string(data)), maxHead)
		line, hosts, err := readHead(br)
		_ = lineHost(line)
		if err != nil {
			return
		}
		req, err := http.ReadRequest(br)
		if err != nil {
			return
		}
		tg, _, reason := requestTarget(req, hosts)
		if reason == "" && (tg.host == "" || tg.port == 0) {
			t.Fatalf("passed without a host or port: %+v from %q", tg, data)
		}
	})
}

// blockingResolver answers nothing until it is given up on.
type blockingResolver struct{}

func (blockingResolver) LookupNetIP(ctx context.Context, _, _ string) ([]netip.Addr, error) {
	<-ctx.Done()
	return nil, ctx.Err()
}

// fullListener returns the port of a listener whose queue of connections
// not yet accepted is full: a further connection to it is never answered
// (Linux drops its SYN), as a host that drops packets would do.
func fullListener(t *testing.T) int {
	t.Helper()
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Close(fd) })
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Listen(fd, 0); err != nil {
		t.Fatal(err)
	}
	sa, err := syscall.Getsockname(fd)
	if err != nil {
		t.Fatal(err)
	}
	p := sa.(*syscall.SockaddrInet4).Port
	// Fill the queue; the connections that complete are never accepted.
	for range 4 {
		c, err := net.DialTimeout("tcp", fmt.Sprintf("127.0.0.1:%d", p), 200*time.Millisecond)
		if err != nil {
			break
		}
		t.Cleanup(func() { c.Close() })
	}
	return p
}

// TestProxyConnectTimeout: a name that does not resolve in time and an
// address that never answers each cost a program the connect timeout, not
// its run's time, and are recorded as such.
func TestProxyConnectTimeout(t *testing.T) {
	full := fullListener(t)
	lo := netip.MustParseAddr("127.0.0.1")
	f := newFixture(t, func(s *Settings) {
		s.ConnectTimeout = 300 * time.Millisecond
		s.Resolver = blockingResolver{}
		s.Hosts["full.test"] = Mapping{lo, uint16(full)}
	})
	for _, tt := range []struct {
		name, request, host string
		status              int
		reason              string
	}{
		{"a name that does not resolve in time", "GET http://slow.example/ HTTP/1.1\r\nHost: slow.example\r\n\r\n", "slow.example",
			http.StatusForbidden, "the name does not resolve"},
		{"an address that never answers", fmt.Sprintf("GET http://full.test:%d/ HTTP/1.1\r\nHost: full.test:%[1]d\r\n\r\n", full), "full.test",
			http.StatusBadGateway, "could not connect: timed out"},
		{"a tunnel to an address that never answers", fmt.Sprintf("CONNECT full.test:%d HTTP/1.1\r\nHost: full.test:%[1]d\r\n\r\n", full), "full.test",
			http.StatusBadGateway, "could not connect: timed out"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			r := f.open("slow.example", "full.test")
			begin := time.Now()
			status, _ := f.raw(t, tt.request)
			took := time.Since(begin)
			recs := r.Close()
			if status != tt.status {
				t.Errorf("answer %d, want %d", status, tt.status)
			}
			if took > 5*time.Second {
				t.Errorf("answered after %v; the connect timeout is 300ms", took)
			}
			if len(recs) != 1 || recs[0].Host != tt.host || !strings.Contains(recs[0].Reason, tt.reason) {
				t.Errorf("records %+v, want one of %q saying %q", recs, tt.host, tt.reason)
			}
		})
	}
}

// A program that opens refused connections in a loop gets its first ones
// recorded one by one and the rest counted, per host and reason: what it
// costs the run's events, result and audit entries is bounded.
func TestProxyCountsConnectionsPastTheRecords(t *testing.T) {
	f := newFixture(t, func(s *Settings) { s.MaxRecords = 5; s.MaxConnections = 1000 })
	r := f.open("files.test")
	for i := range 30 {
		host := "other.test"
		if i%3 == 0 {
			host = "denied.test"
		}
		if status, _ := f.raw(t, fmt.Sprintf("GET http://%s/ HTTP/1.1\r\nHost: %[1]s\r\n\r\n", host)); status != http.StatusForbidden {
			t.Fatalf("connection %d: %d", i, status)
		}
	}
	// Distinct hosts past the counts' bound fall into one count.
	for i := range maxCounts + 10 {
		f.raw(t, fmt.Sprintf("GET http://h%d.test/ HTTP/1.1\r\nHost: h%[1]d.test\r\n\r\n", i))
	}
	recs := r.Close()
	f.mu.Lock()
	got := slices.Clone(f.records)
	f.mu.Unlock()
	if len(recs) > 5+maxCounts+1 || len(got) != len(recs) {
		t.Fatalf("%d records returned, %d recorded: want at most %d, the same", len(recs), len(got), 5+maxCounts+1)
	}
	total, counted := 0, map[string]int{}
	for i, e := range recs {
		if e.Allowed {
			t.Errorf("allowed: %+v", e)
		}
		switch {
		case i < 5 && e.Count != 0:
			t.Errorf("record %d is a count: %+v", i, e)
		case i >= 5 && e.Count == 0:
			t.Errorf("record %d past the first 5 is not a count: %+v", i, e)
		}
		total += max(e.Count, 1)
		counted[e.Host+" "+e.Reason] += e.Count
	}
	if total != 30+maxCounts+10 {
		t.Errorf("the records stand for %d connections, want %d", total, 30+maxCounts+10)
	}
	if counted["other.test not among this run's network.allowed_domains"] == 0 ||
		counted["denied.test not among this run's network.allowed_domains"] == 0 || counted[" "+otherConnections] == 0 {
		t.Errorf("counts %v", counted)
	}
}

// counted is an HTTP server on loopback that counts the connections open
// to it.
type counted struct {
	srv  *httptest.Server
	open atomic.Int64
}

func newCounted(t *testing.T) *counted {
	t.Helper()
	c := &counted{}
	c.srv = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "hi") }))
	c.srv.Config.ConnState = func(_ net.Conn, st http.ConnState) {
		switch st {
		case http.StateNew:
			c.open.Add(1)
		case http.StateClosed, http.StateHijacked:
			c.open.Add(-1)
		}
	}
	c.srv.Start()
	t.Cleanup(c.srv.Close)
	return c
}

// atMost waits for at most n connections to be open, and says whether
// they came down to that.
func (c *counted) atMost(n int64) bool {
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if c.open.Load() <= n {
			return true
		}
	}
	return false
}

// TestProxyIdleBounds: a run cycling through many allowed names keeps at
// most MaxIdlePerRun of its upstream connections idle, and all runs
// together at most MaxIdle — not one per name and host.
func TestProxyIdleBounds(t *testing.T) {
	up := newCounted(t)
	lo := netip.MustParseAddr("127.0.0.1")
	f := newFixture(t, func(s *Settings) {
		s.MaxIdlePerRun, s.MaxIdle = 4, 6
		for i := range 40 {
			s.Hosts[fmt.Sprintf("n%d.cycle.test", i)] = Mapping{lo, uint16(port(t, up.srv.URL))}
		}
	})
	cycle := func(run string, from, to int) *http.Client {
		t.Helper()
		f.mu.Lock()
		f.run = run
		f.mu.Unlock()
		r := f.open("*.cycle.test")
		t.Cleanup(func() { r.Close() })
		c := f.client() // one connection to the proxy, kept alive
		t.Cleanup(c.CloseIdleConnections)
		for i := from; i < to; i++ {
			resp, err := c.Get(fmt.Sprintf("http://n%d.cycle.test:%d/", i, port(t, up.srv.URL)))
			if err != nil {
				t.Fatal(err)
			}
			b, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			if resp.StatusCode != 200 || string(b) != "hi" {
				t.Fatalf("n%d: %d %q", i, resp.StatusCode, b)
			}
		}
		return c
	}
	c1 := cycle("run-1", 0, 20)
	if !up.atMost(4) {
		t.Errorf("one run holds %d upstream connections after 20 names, want at most 4", up.open.Load())
	}
	cycle("run-2", 20, 40)
	if !up.atMost(6) {
		t.Errorf("two runs hold %d upstream connections, want at most 6", up.open.Load())
	}
	// A connection let go is dialled again when needed.
	if resp, err := c1.Get(fmt.Sprintf("http://n0.cycle.test:%d/", port(t, up.srv.URL))); err != nil || resp.StatusCode != 200 {
		t.Errorf("again: %v %v", resp, err)
	} else {
		resp.Body.Close()
	}
}

// staticResolver resolves names from a table.
type staticResolver map[string][]netip.Addr

func (r staticResolver) LookupNetIP(_ context.Context, _, host string) ([]netip.Addr, error) {
	if a, ok := r[host]; ok {
		return a, nil
	}
	return nil, &net.DNSError{Err: "no such host", Name: host, IsNotFound: true}
}

// TestProxyDenyRanges: SANDBOX_EGRESS_DENY_CIDRS refuses names that lead
// into its ranges — any of their addresses, for a request or a tunnel —
// and mapped names too. (Nothing here is dialled: every case is refused.)
func TestProxyDenyRanges(t *testing.T) {
	deny, err := ParseRanges("198.18.0.0/15, 8.8.8.0/24, 127.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	f := newFixture(t, func(s *Settings) {
		s.Deny = deny
		s.Resolver = staticResolver{
			"host.test":  {netip.MustParseAddr("8.8.8.8")},
			"multi.test": {netip.MustParseAddr("1.1.1.1"), netip.MustParseAddr("::ffff:8.8.8.9")},
		}
	})
	for _, tt := range []struct{ name, request, reason string }{
		{"a name resolving into a range", "GET http://host.test/ HTTP/1.1\r\nHost: host.test\r\n\r\n", "resolves to an address in SANDBOX_EGRESS_DENY_CIDRS"},
		{"one address of several", "GET http://multi.test/ HTTP/1.1\r\nHost: multi.test\r\n\r\n", "resolves to an address in SANDBOX_EGRESS_DENY_CIDRS"},
		{"a tunnel", "CONNECT host.test:443 HTTP/1.1\r\nHost: host.test:443\r\n\r\n", "SANDBOX_EGRESS_DENY_CIDRS"},
		{"a mapped name", fmt.Sprintf("GET http://files.test:%d/hello HTTP/1.1\r\n\r\n", f.files), "mapped to an address in SANDBOX_EGRESS_DENY_CIDRS"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			r := f.open("host.test", "multi.test", "files.test")
			status, body := f.raw(t, tt.request)
			recs := r.Close()
			if status != http.StatusForbidden || !strings.Contains(body, tt.reason) {
				t.Errorf("answer %d %q, want 403 saying %q", status, body, tt.reason)
			}
			if len(recs) != 1 || recs[0].Allowed || !strings.Contains(recs[0].Reason, tt.reason) {
				t.Errorf("records %+v", recs)
			}
		})
	}
}
