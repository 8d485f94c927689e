package egress

import (
	"bufio"
	"compress/gzip"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"fmt"
	"io"
	"math/big"
	"net/http"
	"net/http/httptest"
	"net/http/httptrace"
	"net/netip"
	"net/textproto"
	"net/url"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/runbox-dev/runbox"
)

const (
	testValue = "sk-live-0123456789abcdef"
	// testKey is a second secret, set by placeholder only where the
	// program puts it.
	testKeyValue = "key-9876543210fedcba"
)

// testCA is an authority the tests' upstream servers use, as a company's
// internal one would be: trusted through UpstreamRoots only.
type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pool *x509.CertPool
}

func newTestCA(t testing.TB) *testCA {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test upstream CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IsCA: true, BasicConstraintsValid: true,
		KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	return &testCA{cert: cert, key: key, pool: pool}
}

// serve starts an HTTPS server on loopback with a certificate for names.
func (ca *testCA) serve(t testing.TB, h http.Handler, names ...string) int {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: names[0]}, DNSNames: names,
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	srv := httptest.NewUnstartedServer(h)
	srv.TLS = &tls.Config{Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key}}}
	srv.StartTLS()
	t.Cleanup(srv.Close)
	return port(t, srv.URL)
}

// seen is what the upstream servers were sent.
type seen struct {
	mu   sync.Mutex
	reqs []*http.Request
}

func (s *seen) add(r *http.Request) {
	s.mu.Lock()
	s.reqs = append(s.reqs, r)
	s.mu.Unlock()
}

func (s *seen) last(t *testing.T) *http.Request {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	if len(s.reqs) == 0 {
		t.Fatal("the server saw no request")
	}
	return s.reqs[len(s.reqs)-1]
}

func (s *seen) count() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.reqs)
}

// secretFixture is a proxy with secrets: api.secret.test (HTTPS, the
// secrets' domain, echoing what it is sent), web.secret.test (plain HTTP,
// in the domain too), other.test (HTTPS, not the secrets'), bad.secret.test
// (HTTPS with a certificate no one trusts), stream.secret.test (an event
// stream) and ws.secret.test (an upgrade to a stream that says whether the
// upgrade carried the secret, and echoes a line).
type secretFixture struct {
	*fixture
	secrets            Secrets
	ca                 *CA
	api, web, bad, str int
	ws                 int
	other              int
	seen               *seen
	step               chan struct{} // lets stream.secret.test send its second event
	upstreamPool       *x509.CertPool
}

func newSecretFixture(t testing.TB, change ...func(*Settings)) *secretFixture {
	t.Helper()
	sf := &secretFixture{seen: &seen{}, step: make(chan struct{})}
	upstream := newTestCA(t)
	echo := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		sf.seen.add(r)
		// A server that reflects what it was sent, as some do.
		auth := r.Header.Get("Authorization")
		var body io.Writer = w
		switch r.URL.Path {
		case "/hints":
			// Early hints that reflect the request, after its body is
			// read (for which the server sends 100 Continue first).
			io.Copy(io.Discard, r.Body)
			w.Header().Set("Link", "</style.css>; rel=preload; title=\""+auth+"\"")
			w.Header().Set("X-Echo", auth)
			w.WriteHeader(http.StatusEarlyHints)
			w.Header().Del("Link")
		case "/gzip":
			// A server that compresses though asked not to.
			w.Header().Set("Content-Encoding", "gzip")
			gz := gzip.NewWriter(w)
			defer gz.Close()
			body = gz
		case "/br":
			// One that says it used a coding the proxy cannot undo.
			w.Header().Set("Content-Encoding", "br")
		}
		w.Header().Set("X-Echo", auth)
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(body).Encode(map[string]any{"host": r.Host, "path": r.URL.String(), "header": r.Header})
	})
	sf.api = upstream.serve(t, echo, "api.secret.test")
	sf.other = upstream.serve(t, echo, "other.test")
	plain := httptest.NewServer(echo)
	t.Cleanup(plain.Close)
	sf.web = port(t, plain.URL)
	bad := httptest.NewTLSServer(echo) // its certificate is for example.com, by an authority no one trusts
	t.Cleanup(bad.Close)
	sf.bad = port(t, bad.URL)
	sf.str = upstream.serve(t, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		fmt.Fprintf(w, "data: first %s\n\n", r.Header.Get("Authorization"))
		w.(http.Flusher).Flush()
		select {
		case <-sf.step:
		case <-r.Context().Done():
			return
		}
		io.WriteString(w, "data: second\n\n")
	}), "stream.secret.test")

	sf.ws = upstream.serve(t, http.HandlerFunc(sf.websocket), "ws.secret.test")

	sf.secrets = Secrets{
		"svc": {Name: "svc", Value: testValue, Domains: mustPatterns("api.secret.test", "*.secret.test"), Header: "Authorization",
			Format: "Bearer {value}"},
		"key": {Name: "key", Value: testKeyValue, Domains: mustPatterns("api.secret.test"), Header: "X-Service-Key", Format: "{value}"},
	}
	var err error
	sf.ca, err = NewCA([]byte("the deployment's secret"), sf.secrets.Domains(), nil)
	if err != nil {
		t.Fatal(err)
	}
	lo := netip.MustParseAddr("127.0.0.1")
	sf.fixture = newFixture(t, func(s *Settings) {
		s.Hosts["api.secret.test"] = Mapping{lo, uint16(sf.api)}
		s.Hosts["web.secret.test"] = Mapping{lo, uint16(sf.web)}
		s.Hosts["bad.secret.test"] = Mapping{lo, uint16(sf.bad)}
		s.Hosts["stream.secret.test"] = Mapping{lo, uint16(sf.str)}
		s.Hosts["other.test"] = Mapping{lo, uint16(sf.other)}
		s.Hosts["ws.secret.test"] = Mapping{lo, uint16(sf.ws)}
		s.CA = sf.ca
		s.UpstreamRoots = upstream.pool
		for _, ch := range change {
			ch(s)
		}
	})
	// The program trusts the runbox CA (as the sandbox makes it) and, for
	// the tunnel to other.test, the upstream's.
	sf.upstreamPool = upstream.pool
	return sf
}

func mustPatterns(list ...string) Patterns {
	ps, err := ParsePatterns(list)
	if err != nil {
		panic(err)
	}
	return ps
}

// openSecrets opens a run with grant and the secrets named.
func (sf *secretFixture) openSecrets(t *testing.T, secrets []string, grant ...string) *Run {
	t.Helper()
	ss, err := sf.secrets.Pick(secrets)
	if err != nil {
		t.Fatal(err)
	}
	r := sf.open(grant...)
	r.UseSecrets(ss)
	return r
}

// programClient is a program's HTTP client: through the proxy, trusting
// the runbox CA and the upstream's authority, and nothing else.
func (sf *secretFixture) programClient() *http.Client {
	pool := sf.upstreamPool.Clone()
	pool.AddCert(sf.ca.Certificate())
	return &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{
		Proxy:           http.ProxyURL(&url.URL{Scheme: "http", Host: sf.proxy}),
		TLSClientConfig: &tls.Config{RootCAs: pool},
	}}
}

func get(t *testing.T, c *http.Client, u string, header map[string]string) (*http.Response, string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, u, nil)
	for k, v := range header {
		req.Header.Set(k, v)
	}
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", u, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp, string(b)
}

func TestSecretsReachTheirDomainOnly(t *testing.T) {
	sf := newSecretFixture(t)
	r := sf.openSecrets(t, []string{"svc", "key"}, "api.secret.test", "web.secret.test", "other.test")
	c := sf.programClient()
	// The program holds placeholders, and puts them where an SDK would.
	header := map[string]string{"Authorization": "Bearer " + Placeholder("svc"), "X-Service-Key": Placeholder("key"),
		"X-Both": Placeholder("svc") + "," + Placeholder("key")}

	t.Run("the secrets' domain over HTTPS gets the values", func(t *testing.T) {
		resp, body := get(t, c, fmt.Sprintf("https://api.secret.test:%d/v1/models?q=%s", sf.api, Placeholder("svc")), header)
		got := sf.seen.last(t)
		if a := got.Header.Get("Authorization"); a != "Bearer "+testValue {
			t.Errorf("Authorization %q", a)
		}
		if k := got.Header.Get("X-Service-Key"); k != testKeyValue {
			t.Errorf("X-Service-Key %q", k)
		}
		if b := got.Header.Get("X-Both"); b != testValue+","+testKeyValue {
			t.Errorf("a placeholder elsewhere in the header: %q", b)
		}
		// Not in the URL.
		if !strings.Contains(got.URL.RawQuery, Placeholder("svc")) {
			t.Errorf("the query %q", got.URL.RawQuery)
		}
		if got.Host != fmt.Sprintf("api.secret.test:%d", sf.api) || got.Header.Get("Accept-Encoding") != "identity" {
			t.Errorf("Host %q, Accept-Encoding %q", got.Host, got.Header.Get("Accept-Encoding"))
		}
		// What the server reflects comes back with the placeholders.
		if strings.Contains(body, testValue) || strings.Contains(body, testKeyValue) ||
			!strings.Contains(body, "Bearer "+Placeholder("svc")) || !strings.Contains(body, Placeholder("key")) {
			t.Errorf("the answer holds a value, or not the placeholder: %s", body)
		}
		if e := resp.Header.Get("X-Echo"); e != "Bearer "+Placeholder("svc") {
			t.Errorf("X-Echo %q", e)
		}
		// The program saw the proxy's certificate for the name.
		if cert := resp.TLS.PeerCertificates[0]; cert.Issuer.CommonName != sf.ca.Certificate().Subject.CommonName {
			t.Errorf("certificate by %q", cert.Issuer.CommonName)
		}
	})

	t.Run("plain HTTP to the domain does not", func(t *testing.T) {
		get(t, c, fmt.Sprintf("http://web.secret.test:%d/", sf.web), header)
		got := sf.seen.last(t)
		if a := got.Header.Get("Authorization"); a != "Bearer "+Placeholder("svc") || got.Header.Get("X-Service-Key") != Placeholder("key") {
			t.Errorf("plain HTTP carried %q %q", a, got.Header.Get("X-Service-Key"))
		}
	})

	t.Run("another domain gets the placeholders, through an opaque tunnel", func(t *testing.T) {
		resp, _ := get(t, c, fmt.Sprintf("https://other.test:%d/", sf.other), header)
		got := sf.seen.last(t)
		if a := got.Header.Get("Authorization"); a != "Bearer "+Placeholder("svc") || got.Header.Get("X-Both") != header["X-Both"] {
			t.Errorf("other.test was sent %q %q", a, got.Header.Get("X-Both"))
		}
		if cert := resp.TLS.PeerCertificates[0]; cert.Issuer.CommonName != "test upstream CA" {
			t.Errorf("the tunnel was decrypted: certificate by %q", cert.Issuer.CommonName)
		}
	})

	c.CloseIdleConnections()
	recs := r.Close()
	var api *runbox.Egress
	for i, e := range recs {
		if e.Host == "api.secret.test" {
			api = &recs[i]
		} else if len(e.Secrets) > 0 {
			t.Errorf("%s records secrets %v", e.Host, e.Secrets)
		}
	}
	if api == nil || !api.Allowed || api.BytesIn == 0 || !slices.Equal(api.Secrets, []string{"svc", "key"}) {
		t.Errorf("records %+v: want api.secret.test's connection with both secrets' names", recs)
	}
	if b, _ := json.Marshal(recs); strings.Contains(string(b), testValue) {
		t.Error("a record holds the value")
	}
}

func TestSecretsOnlyForRunsThatAskForThem(t *testing.T) {
	sf := newSecretFixture(t)
	r := sf.open("api.secret.test")
	// Without secrets, the domain is tunnelled: the program meets the
	// server's own certificate.
	resp, _ := get(t, sf.programClient(), fmt.Sprintf("https://api.secret.test:%d/", sf.api),
		map[string]string{"Authorization": "Bearer " + Placeholder("svc")})
	if cert := resp.TLS.PeerCertificates[0]; cert.Issuer.CommonName != "test upstream CA" {
		t.Errorf("certificate by %q", cert.Issuer.CommonName)
	}
	if a := sf.seen.last(t).Header.Get("Authorization"); a != "Bearer "+Placeholder("svc") {
		t.Errorf("Authorization %q", a)
	}
	r.Close()
}

// waitRecords waits until the runs opened recorded n connections.
func (sf *secretFixture) waitRecords(t *testing.T, n int) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for {
		sf.mu.Lock()
		got := len(sf.records)
		sf.mu.Unlock()
		if got >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d records, want %d", got, n)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// tlsThrough opens a CONNECT to host:port and a TLS client over it.
func (sf *secretFixture) tlsThrough(t *testing.T, host string, port int, serverName string) (*tls.Conn, error) {
	t.Helper()
	c, br := sf.dialTunnel(t, host, port)
	pool := x509.NewCertPool()
	pool.AddCert(sf.ca.Certificate())
	tc := tls.Client(&bufferedConn{Conn: c, r: br}, &tls.Config{ServerName: serverName, RootCAs: pool, InsecureSkipVerify: serverName != host})
	c.SetDeadline(time.Now().Add(30 * time.Second))
	return tc, tc.Handshake()
}

func TestSecretsRefuse(t *testing.T) {
	sf := newSecretFixture(t)

	t.Run("a request for another host on the connection", func(t *testing.T) {
		r := sf.openSecrets(t, []string{"svc"}, "api.secret.test", "other.test")
		tc, err := sf.tlsThrough(t, "api.secret.test", sf.api, "api.secret.test")
		if err != nil {
			t.Fatal(err)
		}
		before := sf.seen.count()
		fmt.Fprintf(tc, "GET / HTTP/1.1\r\nHost: other.test:%d\r\nAuthorization: Bearer %s\r\n\r\n", sf.other, Placeholder("svc"))
		resp, err := http.ReadResponse(bufio.NewReader(tc), nil)
		if err != nil {
			t.Fatal(err)
		}
		if resp.StatusCode != http.StatusMisdirectedRequest || sf.seen.count() != before {
			t.Errorf("%d, %d requests reached a server", resp.StatusCode, sf.seen.count()-before)
		}
		tc.Close()
		if recs := r.Close(); len(recs) != 1 || recs[0].Allowed || !strings.Contains(recs[0].Reason, `the Host header names "other.test`) {
			t.Errorf("records %+v", recs)
		}
	})

	t.Run("a TLS server name other than the CONNECT's", func(t *testing.T) {
		r := sf.openSecrets(t, []string{"svc"}, "api.secret.test", "other.test")
		if _, err := sf.tlsThrough(t, "api.secret.test", sf.api, "other.test"); err == nil {
			t.Error("the handshake succeeded")
		}
		if recs := r.Close(); len(recs) != 1 || recs[0].Allowed || !strings.Contains(recs[0].Reason, `TLS server name "other.test"`) {
			t.Errorf("records %+v", recs)
		}
	})

	t.Run("a program that does not trust the CA", func(t *testing.T) {
		r := sf.openSecrets(t, []string{"svc"}, "api.secret.test")
		sf.mu.Lock()
		before := len(sf.records)
		sf.mu.Unlock()
		c := sf.client()
		c.Transport.(*http.Transport).TLSClientConfig = &tls.Config{RootCAs: x509.NewCertPool()}
		if _, err := c.Get(fmt.Sprintf("https://api.secret.test:%d/", sf.api)); err == nil {
			t.Error("a client without the CA got through")
		}
		// The proxy reads the client's alert after the client gave up; a
		// run that ends first ends the handshake without a record.
		sf.waitRecords(t, before+1)
		if recs := r.Close(); len(recs) != 1 || !strings.Contains(recs[0].Reason, "must trust the CA") {
			t.Errorf("records %+v", recs)
		}
	})

	t.Run("a server whose certificate is not trusted", func(t *testing.T) {
		r := sf.openSecrets(t, []string{"svc"}, "bad.secret.test")
		resp, body := get(t, sf.programClient(), fmt.Sprintf("https://bad.secret.test:%d/", sf.bad), nil)
		if resp.StatusCode != http.StatusBadGateway || !strings.Contains(body, "certificate") {
			t.Errorf("%d %q", resp.StatusCode, body)
		}
		if n := sf.seen.count(); n != 0 {
			t.Errorf("the server got %d requests", n)
		}
		recs := r.Close()
		if len(recs) != 1 || !strings.Contains(recs[0].Reason, "TLS with the server failed") {
			t.Errorf("records %+v", recs)
		}
	})

	t.Run("a name the run may not reach", func(t *testing.T) {
		r := sf.openSecrets(t, []string{"svc"}, "other.test")
		status, body := sf.raw(t, fmt.Sprintf("CONNECT api.secret.test:%d HTTP/1.1\r\n\r\n", sf.api))
		if status != http.StatusForbidden || !strings.Contains(body, "not among") {
			t.Errorf("%d %q", status, body)
		}
		r.Close()
	})
}

func TestSecretsStreamedAnswer(t *testing.T) {
	sf := newSecretFixture(t)
	r := sf.openSecrets(t, []string{"svc"}, "stream.secret.test")
	defer r.Close()
	resp, err := sf.programClient().Get(fmt.Sprintf("https://stream.secret.test:%d/", sf.str))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	br := bufio.NewReader(resp.Body)
	// The first event arrives before the server sends the second: the
	// proxy neither buffers the stream nor holds back what cannot be a
	// value's start.
	var got []string
	for len(got) < 2 {
		line, err := br.ReadString('\n')
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, line)
	}
	if got[0] != "data: first Bearer "+Placeholder("svc")+"\n" || got[1] != "\n" {
		t.Errorf("first event %q", got)
	}
	close(sf.step)
	rest, _ := io.ReadAll(br)
	if string(rest) != "data: second\n\n" {
		t.Errorf("second event %q", rest)
	}
}

func TestCA(t *testing.T) {
	domains := mustPatterns("api.example.com", "*.svc.example")
	a, err := NewCA([]byte("secret one"), domains, nil)
	if err != nil {
		t.Fatal(err)
	}
	b, _ := NewCA([]byte("secret one"), domains, nil)
	c, _ := NewCA([]byte("secret two"), domains, nil)
	if !a.Certificate().PublicKey.(*ecdsa.PublicKey).Equal(b.Certificate().PublicKey) {
		t.Error("two executors of a deployment derive different keys")
	}
	if a.Certificate().PublicKey.(*ecdsa.PublicKey).Equal(c.Certificate().PublicKey) {
		t.Error("two deployments share a key")
	}
	if strings.Contains(a.PEM(), "PRIVATE") {
		t.Error("the PEM holds a key")
	}
	roots := x509.NewCertPool()
	roots.AddCert(b.Certificate()) // a leaf of one executor verifies with another's certificate
	for host, ok := range map[string]bool{"api.example.com": true, "x.svc.example": true, "a.b.svc.example": true,
		"svc.example": false, "example.com": false, "evil.com": false, "api.example.com.evil.com": false} {
		leaf, err := a.leaf(host)
		if err != nil {
			t.Fatal(err)
		}
		_, err = leaf.Leaf.Verify(x509.VerifyOptions{DNSName: host, Roots: roots})
		if (err == nil) != ok {
			t.Errorf("%s: verify %v, want ok %v", host, err, ok)
		}
	}
	again, _ := a.leaf("api.example.com")
	if first, _ := a.leaf("api.example.com"); first != again {
		t.Error("a host's certificate is made anew each time")
	}
}

func TestSecretsUseTheRunsContext(t *testing.T) {
	// A run closed while its program waits on a secret domain's answer
	// ends the connection.
	sf := newSecretFixture(t)
	r := sf.openSecrets(t, []string{"svc"}, "stream.secret.test")
	resp, err := sf.programClient().Get(fmt.Sprintf("https://stream.secret.test:%d/", sf.str))
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { _, err := io.ReadAll(resp.Body); done <- err }()
	r.Close()
	select {
	case <-done:
	case <-time.After(time.Minute):
		t.Fatal("the connection outlived its run")
	}
}

// BenchmarkSecretRequest measures a request to a secret's domain, on a
// kept connection, against the same request through a tunnel.
func BenchmarkSecretRequest(b *testing.B) {
	for _, secret := range []bool{false, true} {
		b.Run(map[bool]string{false: "tunnel", true: "decrypted"}[secret], func(b *testing.B) {
			sf := newSecretFixture(b)
			r := sf.open("api.secret.test")
			if secret {
				r.UseSecrets([]Secret{sf.secrets["svc"]})
			}
			defer r.Close()
			c := sf.programClient()
			u := fmt.Sprintf("https://api.secret.test:%d/", sf.api)
			for b.Loop() {
				resp, err := c.Get(u)
				if err != nil {
					b.Fatal(err)
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
			}
			c.CloseIdleConnections()
			b.ReportMetric(float64(len(r.Close())), "upstream-conns")
		})
	}
}

func TestSecretsIdleCounted(t *testing.T) {
	// The decrypted requests' upstream connections count among the
	// proxy's idle ones: the oldest goes past MaxIdle, whichever pool
	// holds it.
	sf := newSecretFixture(t, func(s *Settings) { s.MaxIdle, s.IdleTimeout = 1, 10*time.Minute })
	r1 := sf.openSecrets(t, []string{"svc"}, "api.secret.test")
	defer r1.Close()
	get(t, sf.programClient(), fmt.Sprintf("https://api.secret.test:%d/", sf.api), nil)
	sf.mu.Lock()
	sf.run = "run-2"
	sf.mu.Unlock()
	r2 := sf.open("web.secret.test")
	defer r2.Close()
	get(t, sf.programClient(), fmt.Sprintf("http://web.secret.test:%d/", sf.web), nil)
	sf.waitRecords(t, 1) // the first closed, recorded as it ends
	sf.mu.Lock()
	defer sf.mu.Unlock()
	if sf.records[0].Host != "api.secret.test" || !slices.Equal(sf.records[0].Secrets, []string{"svc"}) {
		t.Errorf("records %+v", sf.records)
	}
}

func TestSecretsInterimAnswers(t *testing.T) {
	// A server that answers 103 Early Hints echoing the secret's header
	// before its final answer: the program reads no interim answer of the
	// server's (100 Continue comes from the proxy itself), and the final
	// one scrubbed.
	sf := newSecretFixture(t)
	r := sf.openSecrets(t, []string{"svc"}, "api.secret.test")
	defer r.Close()
	var (
		mu      sync.Mutex
		interim []string
		got100  bool
	)
	trace := &httptrace.ClientTrace{
		Got100Continue: func() { mu.Lock(); got100 = true; mu.Unlock() },
		Got1xxResponse: func(code int, h textproto.MIMEHeader) error {
			mu.Lock()
			defer mu.Unlock()
			interim = append(interim, fmt.Sprint(code, h))
			return nil
		},
	}
	c := sf.programClient()
	c.Transport.(*http.Transport).ExpectContinueTimeout = time.Minute
	req, _ := http.NewRequestWithContext(httptrace.WithClientTrace(t.Context(), trace), http.MethodPost,
		fmt.Sprintf("https://api.secret.test:%d/hints", sf.api), strings.NewReader("a body"))
	req.Header.Set("Expect", "100-continue")
	resp, err := c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if a := sf.seen.last(t).Header.Get("Authorization"); a != "Bearer "+testValue {
		t.Fatalf("the server was sent %q", a)
	}
	mu.Lock()
	defer mu.Unlock()
	for _, h := range interim {
		if strings.Contains(h, testValue) {
			t.Errorf("an interim answer holds the value: %s", h)
		}
	}
	if len(interim) != 1 || !strings.HasPrefix(interim[0], "100 ") || !got100 {
		t.Errorf("interim answers %q (100 Continue: %v), want the proxy's 100 Continue alone", interim, got100)
	}
	if resp.StatusCode != http.StatusOK || resp.Header.Get("X-Echo") != "Bearer "+Placeholder("svc") ||
		strings.Contains(string(body), testValue) || resp.Header.Get("Link") != "" {
		t.Errorf("%d %v %s", resp.StatusCode, resp.Header, body)
	}
}

func TestSecretsCompressedAnswer(t *testing.T) {
	// A server that compresses its answer though the proxy asked for
	// none: a coding the proxy can undo (gzip) is undone and scrubbed, any
	// other refused.
	sf := newSecretFixture(t)
	r := sf.openSecrets(t, []string{"svc"}, "api.secret.test")
	c := sf.programClient()
	resp, body := get(t, c, fmt.Sprintf("https://api.secret.test:%d/gzip", sf.api), nil)
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Content-Encoding") != "" || resp.Uncompressed ||
		strings.Contains(body, testValue) || !strings.Contains(body, "Bearer "+Placeholder("svc")) {
		t.Errorf("gzip: %d %v (uncompressed by the client: %v) %s", resp.StatusCode, resp.Header, resp.Uncompressed, body)
	}
	resp, body = get(t, c, fmt.Sprintf("https://api.secret.test:%d/br", sf.api), nil)
	if resp.StatusCode != http.StatusBadGateway || strings.Contains(body, testValue) || !strings.Contains(body, "br") {
		t.Errorf("br: %d %s", resp.StatusCode, body)
	}
	c.CloseIdleConnections()
	if recs := r.Close(); !slices.ContainsFunc(recs, func(e runbox.Egress) bool { return strings.Contains(e.Reason, `coding "br"`) }) {
		t.Errorf("records %+v", recs)
	}
}
