package egress

import (
	"bufio"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptrace"
	"net/http/httputil"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/net/http/httpguts"

	"github.com/runbox-dev/runbox"
)

// A CONNECT to a domain of one of the run's secrets is not tunnelled: the
// proxy ends the program's TLS itself, with a certificate for the CONNECT's
// name that the deployment's CA signs (ca.go), reads the requests inside
// with net/http's server, puts the secrets into each one's headers
// (secrets.go) and sends it on over a TLS connection of its own to the same
// name, verified as any client would (the system's roots, and
// SANDBOX_EGRESS_CA_FILE's), and the response back with the values
// scrubbed. Every other CONNECT stays an opaque tunnel.
//
// What decides is the CONNECT's name, which the policy checked: the
// program's TLS server name must be that name, and so must every request's
// Host (a request for another name on the connection is refused, 421).
// Only HTTP/1.1 is offered (ALPN). Answers are scrubbed (scrub.go);
// interim ones are not passed on; the one upgrade carried is WebSocket,
// the secrets in the upgrade request's header and the server's frames
// scrubbed (websocket.go).

// UseSecrets makes the run's requests to the secrets' domains carry them,
// from now on; nil: none.
func (r *Run) UseSecrets(ss []Secret) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.secrets = ss
	if len(ss) > 0 && r.secure == nil {
		r.secure = &http.Transport{
			DialTLSContext: r.dialSecure,
			// Counted with the run's other idle connections in the
			// proxy's MaxIdle (idleTrace).
			MaxIdleConns:          min(4, r.p.s.MaxIdlePerRun),
			MaxIdleConnsPerHost:   min(2, r.p.s.MaxIdlePerRun),
			ReadBufferSize:        copyBuffer,
			IdleConnTimeout:       r.p.s.IdleTimeout,
			ResponseHeaderTimeout: r.p.s.IdleTimeout,
			ExpectContinueTimeout: time.Second,
			DisableCompression:    true,
		}
	}
}

// secretsFor returns the secrets of the run whose domains name host, if
// the proxy can decrypt its requests.
func (r *Run) secretsFor(host string) []Secret {
	if r.p.s.CA == nil {
		return nil
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	return matching(r.secrets, host)
}

// handshakeTimeout bounds the program's TLS handshake with the proxy.
const handshakeTimeout = 30 * time.Second

// intercept serves a CONNECT to t, a domain of the secrets ss.
func (r *Run) intercept(c net.Conn, br *bufio.Reader, t target, ss []Secret) {
	// What the policy refuses once the name is resolved is refused on
	// the CONNECT, as for a tunnel, rather than after the handshake.
	if _, reason := r.resolve(r.ctx, t); reason != "" {
		r.add(runbox.Egress{Host: t.host, Port: int(t.port), Reason: reason})
		writeRefusal(c, http.StatusForbidden, reason)
		return
	}
	if _, err := io.WriteString(c, "HTTP/1.1 200 Connection established\r\n\r\n"); err != nil {
		return
	}
	var sni string
	tc := tls.Server(&bufferedConn{Conn: c, r: br}, &tls.Config{
		MinVersion: tls.VersionTLS12,
		NextProtos: []string{"http/1.1"},
		GetCertificate: func(h *tls.ClientHelloInfo) (*tls.Certificate, error) {
			sni = h.ServerName
			if sni != "" && NormalizeHost(sni) != t.host {
				return nil, errSNI
			}
			return r.p.s.CA.leaf(t.host)
		},
	})
	_ = c.SetDeadline(time.Now().Add(min(handshakeTimeout, r.p.s.IdleTimeout)))
	// The run's end closes c, and so ends the handshake.
	if err := tc.Handshake(); err != nil {
		rec := runbox.Egress{Host: t.host, Port: int(t.port), Allowed: true,
			Reason: "the program's TLS handshake with the proxy failed (its client must trust the CA in SSL_CERT_FILE)"}
		switch {
		case errors.Is(err, errSNI):
			rec.Allowed = false
			rec.Reason = fmt.Sprintf("the TLS server name %q is not the CONNECT's", cut(sni))
		case errors.Is(err, net.ErrClosed):
			return // the run ended
		}
		r.add(rec)
		return
	}
	_ = c.SetDeadline(time.Time{})
	r.serveSecure(tc, t, ss)
}

var errSNI = errors.New("the TLS server name is not the CONNECT's")

// serveSecure serves the requests of the program's decrypted connection
// tc until it ends.
func (r *Run) serveSecure(tc *tls.Conn, t target, ss []Secret) {
	var handlers sync.WaitGroup
	ln := &oneConn{c: tc, done: make(chan struct{})}
	rp := r.secureProxy(t, ss)
	srv := &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
			handlers.Add(1)
			defer handlers.Done()
			status, reason := http.StatusMisdirectedRequest, misdirected(req, t)
			if reason == "" {
				status, reason = http.StatusForbidden, unscrubbableUpgrade(req)
			}
			if reason != "" {
				r.add(runbox.Egress{Host: t.host, Port: int(t.port), Reason: reason})
				w.Header().Set("Connection", "close")
				refuse(w, status, reason)
				return
			}
			rp.ServeHTTP(finalOnly{w}, req)
		}),
		ReadHeaderTimeout: r.p.s.IdleTimeout,
		IdleTimeout:       r.p.s.IdleTimeout,
		MaxHeaderBytes:    maxHead,
		ErrorLog:          discardLog,
		ConnState: func(_ net.Conn, s http.ConnState) {
			if s == http.StateClosed || s == http.StateHijacked {
				ln.Close()
			}
		},
		BaseContext: func(net.Listener) context.Context { return r.ctx },
	}
	_ = srv.Serve(ln)
	// An upgraded connection is served by its handler still.
	handlers.Wait()
}

// secureProxy returns what sends the requests of a decrypted connection
// to t on, with the secrets ss, and scrubs what comes back.
func (r *Run) secureProxy(t target, ss []Secret) *httputil.ReverseProxy {
	rd := newRedaction(ss)
	record := func(reason string) { r.add(runbox.Egress{Host: t.host, Port: int(t.port), Reason: reason}) }
	return &httputil.ReverseProxy{
		Rewrite: func(pr *httputil.ProxyRequest) {
			pr.Out = pr.Out.WithContext(httptrace.WithClientTrace(pr.Out.Context(), r.p.idleTrace()))
			pr.Out.URL.Scheme = "https"
			pr.Out.URL.Host = net.JoinHostPort(t.host, strconv.Itoa(int(t.port)))
			pr.Out.Host = pr.In.Host
			// A compressed answer, or WebSocket message, could not be
			// scrubbed.
			pr.Out.Header.Set("Accept-Encoding", "identity")
			pr.Out.Header.Del("Sec-Websocket-Extensions")
			applySecrets(pr.Out.Header, ss)
		},
		Transport:     r.secureTransport(),
		FlushInterval: -1, // streamed answers (server-sent events) as they come
		ModifyResponse: func(resp *http.Response) error {
			return scrubResponse(resp, rd, func(why string) {
				record("the WebSocket was ended at a frame the proxy cannot scrub: " + why)
			})
		},
		ErrorHandler: func(w http.ResponseWriter, _ *http.Request, err error) {
			var (
				ref *refusal
				un  *unscrubbable
			)
			switch {
			case errors.As(err, &ref):
				refuse(w, http.StatusForbidden, ref.reason)
			case errors.As(err, &un):
				record(un.reason)
				refuse(w, http.StatusBadGateway, un.reason)
			default:
				refuse(w, http.StatusBadGateway, "could not reach "+t.host+": "+upstreamError(err))
			}
		},
		ErrorLog: discardLog,
	}
}

// misdirected says why a request on a connection to t is refused: it
// names another host (or port) than the CONNECT did.
func misdirected(req *http.Request, t target) string {
	if req.ProtoMajor != 1 {
		return "only HTTP/1.x is proxied"
	}
	if !sameAuthority(req.Host, t, "443") {
		return fmt.Sprintf("the Host header names %q, not the CONNECT's target", cut(req.Host))
	}
	if req.URL.Host != "" && !sameAuthority(req.URL.Host, t, "443") {
		return fmt.Sprintf("the request names %q, not the CONNECT's target", cut(req.URL.Host))
	}
	return ""
}

// unscrubbableUpgrade says why a request for an upgrade is refused: to
// any protocol but WebSocket, whose stream the proxy could not scrub
// (HTTP/2's, say, compresses headers).
func unscrubbableUpgrade(req *http.Request) string {
	if !httpguts.HeaderValuesContainsToken(req.Header["Connection"], "upgrade") {
		return ""
	}
	// As httputil reads it: an empty Upgrade asks for none.
	if up := req.Header.Get("Upgrade"); up != "" && !strings.EqualFold(up, "websocket") {
		return fmt.Sprintf("an upgrade to %q: the proxy carries only WebSocket to a secret's domain, whose stream it can scrub", cut(up))
	}
	return ""
}

// scrubResponse replaces the forms of the secrets' values in what a
// server answers: the header, and a body with its content coding undone,
// with the trailers; a 101's stream (a WebSocket's), telling refused why
// it ends one. An answer the proxy cannot scrub is an *unscrubbable
// error.
func scrubResponse(resp *http.Response, rd *redaction, refused func(string)) error {
	rd.header(resp.Header)
	rd.header(resp.Trailer) // their names, announced in the header
	if resp.StatusCode == http.StatusSwitchingProtocols {
		return scrubUpgrade(resp, rd, refused)
	}
	if resp.Body == nil || resp.Body == http.NoBody {
		return nil
	}
	body, err := decoded(resp)
	if err != nil {
		return err
	}
	resp.Body = newScrubber(body, rd, func() { rd.header(resp.Trailer) })
	// Its length may change.
	resp.Header.Del("Content-Length")
	resp.ContentLength = -1
	return nil
}

// scrubUpgrade makes a 101's stream a scrubbed WebSocket (websocket.go),
// or refuses it: a 101 the program did not ask for (it asked for a
// WebSocket or no upgrade at all: unscrubbableUpgrade), or with an
// extension. Refused here, the server's connection is closed; httputil's
// own check of the protocol would leave it open.
func scrubUpgrade(resp *http.Response, rd *redaction, refused func(string)) error {
	switch {
	case resp.Request.Header.Get("Upgrade") == "" || !strings.EqualFold(resp.Header.Get("Upgrade"), "websocket"):
		return &unscrubbable{fmt.Sprintf("the server switched to %q, not to the WebSocket asked for", cut(resp.Header.Get("Upgrade")))}
	case resp.Header.Get("Sec-Websocket-Extensions") != "":
		return &unscrubbable{"the server chose a WebSocket extension (compression, say) though offered none: its frames could not be scrubbed"}
	}
	up, ok := resp.Body.(io.ReadWriteCloser)
	if !ok {
		return errors.New("a 101 whose stream cannot be written")
	}
	resp.Body = newWSScrubber(up, rd, refused)
	// The reason phrase the program reads is net/http's own: httputil
	// writes a 101's as the server sent it.
	resp.Status = ""
	return nil
}

// finalOnly is the program's side of a request to a secret's domain:
// no interim (1xx) answer of the server's reaches it. 100 Continue comes
// from the proxy's own server, as the request's body is read; the others
// (103 Early Hints, 102 Processing) are advice a client goes without,
// and one less path the value could take. A 101 is a final answer, and
// written after a hijack, not here.
type finalOnly struct{ http.ResponseWriter }

func (w finalOnly) WriteHeader(code int) {
	if code >= 100 && code <= 199 {
		return
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w finalOnly) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// refuse answers a request the proxy will not carry, and says why.
func refuse(w http.ResponseWriter, status int, reason string) {
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	w.Header().Set("X-Runbox-Egress", "refused")
	w.WriteHeader(status)
	io.WriteString(w, "runbox egress: "+reason+"\n")
}

// secureTransport returns the pool of the run's requests to its secrets'
// domains.
func (r *Run) secureTransport() *http.Transport {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.secure
}

// dialSecure connects to a secret's domain for the run, as connect does,
// and makes the connection TLS, verifying the server.
func (r *Run) dialSecure(ctx context.Context, _, addr string) (net.Conn, error) {
	host, port, err := net.SplitHostPort(addr)
	n, _ := strconv.ParseUint(port, 10, 16)
	if err != nil || n == 0 {
		return nil, fmt.Errorf("bad address %q", addr)
	}
	t := target{host: NormalizeHost(host), port: uint16(n)}
	c, err := r.connect(ctx, t, nil)
	if err != nil {
		return nil, err
	}
	u := c.(*upstream)
	u.mu.Lock()
	u.rec.Secrets = names(r.secretsFor(t.host))
	u.mu.Unlock()
	tc := tls.Client(c, &tls.Config{ServerName: t.host, RootCAs: r.p.s.UpstreamRoots, MinVersion: tls.VersionTLS12,
		NextProtos: []string{"http/1.1"}})
	hctx, cancel := context.WithTimeout(ctx, r.p.s.ConnectTimeout)
	defer cancel()
	if err := tc.HandshakeContext(hctx); err != nil {
		u.mu.Lock()
		u.rec.Reason = "TLS with the server failed: " + upstreamError(err)
		u.mu.Unlock()
		c.Close()
		return nil, err
	}
	return tc, nil
}

// upstreamError says, in a few words that hold nothing of the request,
// why a server could not be reached.
func upstreamError(err error) string {
	var (
		unknown  x509.UnknownAuthorityError
		hostname x509.HostnameError
		invalid  x509.CertificateInvalidError
		verify   *tls.CertificateVerificationError
	)
	switch {
	case errors.As(err, &unknown):
		return "its certificate is not signed by a trusted authority"
	case errors.As(err, &hostname):
		return "its certificate is not for this name"
	case errors.As(err, &invalid):
		return "its certificate is not valid"
	case errors.As(err, &verify):
		return "its certificate could not be verified"
	}
	return dialError(err)
}

var discardLog = log.New(io.Discard, "", 0)

// bufferedConn is a connection whose first bytes were read into r.
type bufferedConn struct {
	net.Conn
	r *bufio.Reader
}

func (c *bufferedConn) Read(p []byte) (int, error) { return c.r.Read(p) }

// oneConn is a listener that gives one connection, then waits until it
// is closed.
type oneConn struct {
	c    net.Conn
	once sync.Once
	stop sync.Once
	done chan struct{}
}

func (l *oneConn) Accept() (net.Conn, error) {
	var c net.Conn
	l.once.Do(func() { c = l.c })
	if c != nil {
		return c, nil
	}
	<-l.done
	return nil, net.ErrClosed
}

func (l *oneConn) Close() error {
	l.stop.Do(func() { close(l.done) })
	return nil
}

func (l *oneConn) Addr() net.Addr { return l.c.LocalAddr() }

// TrustPEM returns the certificate a sandbox whose run asks for secrets
// trusts (the CA's), or "" if the proxy has none.
func (p *Proxy) TrustPEM() string {
	if p.s.CA == nil {
		return ""
	}
	return p.s.CA.PEM()
}
