package preview

import (
	"bufio"
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/jonboulle/clockwork"
	"golang.org/x/net/http/httpguts"
	"golang.org/x/time/rate"

	"github.com/runbox-dev/runbox/internal/lifecycle"
	"github.com/runbox-dev/runbox/internal/link"
)

// Limits bound what a preview may cost the api.
type Limits struct {
	// MaxRequest bounds a request's body (PREVIEW_MAX_REQUEST_BYTES).
	MaxRequest int64
	// MaxResponse bounds a response's body, and each direction of a
	// WebSocket (PREVIEW_MAX_RESPONSE_BYTES).
	MaxResponse int64
	// Rate bounds the requests a second to one preview URL, WebSocket
	// upgrades included (PREVIEW_RATE); twice as many may come at once.
	Rate int
	// WriteStall bounds how long one write to a client may block.
	WriteStall time.Duration
	// StreamIdle ends an upgraded stream (a WebSocket) that carried no
	// byte either way for that long (PREVIEW_WS_IDLE).
	StreamIdle time.Duration
	// MaxStreams bounds the upgraded streams open at once through this
	// process (PREVIEW_MAX_STREAMS); MaxStreamsPerConversation those to
	// one conversation's sandboxes, whatever their URL
	// (PREVIEW_MAX_STREAMS_PER_CONVERSATION).
	MaxStreams, MaxStreamsPerConversation int
}

// Defaults of Limits.
const (
	DefaultStreamIdle                = 10 * time.Minute
	DefaultMaxStreams                = 1000
	DefaultMaxStreamsPerConversation = 32
)

// sweepInterval is how often the router forgets expired previews and
// closes the streams they still hold.
const sweepInterval = 30 * time.Second

// Router serves the requests whose Host is a preview host, and only
// those: it resolves the capability, then proxies the request (HTTP, or a
// WebSocket after its upgrade) to the port in the sandbox, through the
// executor that holds it (package link). The api host never reaches it,
// and it reaches nothing of the api. It is a lifecycle.Service: its loop
// forgets expired previews and ends their streams; Stop ends every
// stream.
type Router struct {
	lifecycle.Base
	svc    *Service
	link   link.Link
	limits Limits
	clock  clockwork.Clock
	log    *slog.Logger
	proxy  *httputil.ReverseProxy
	tr     *http.Transport

	mu       sync.Mutex
	targets  map[string]*routed // by record id
	stopping bool
	// streams counts the upgraded streams open (or being opened), in all
	// and by conversation.
	streams  int
	convOpen map[string]int
}

// routed is what the router keeps for a preview in use.
type routed struct {
	Target
	limiter *rate.Limiter
	streams map[io.Closer]struct{} // upgraded connections, ended at expiry
}

// NewRouter returns a Router over svc's previews.
func NewRouter(svc *Service, l link.Link, limits Limits, clock clockwork.Clock, log *slog.Logger) *Router {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	limits.StreamIdle = cmp.Or(limits.StreamIdle, DefaultStreamIdle)
	limits.MaxStreams = cmp.Or(limits.MaxStreams, DefaultMaxStreams)
	limits.MaxStreamsPerConversation = cmp.Or(limits.MaxStreamsPerConversation, DefaultMaxStreamsPerConversation)
	r := &Router{svc: svc, link: l, limits: limits, clock: clock, log: log.With("component", "preview"),
		targets: map[string]*routed{}, convOpen: map[string]int{}}
	r.tr = &http.Transport{
		DialContext:         r.dial,
		MaxIdleConnsPerHost: 16,
		IdleConnTimeout:     90 * time.Second,
		// Dev servers answer at once or stream; a head that takes longer
		// than this is a server that hangs.
		ResponseHeaderTimeout: time.Minute,
	}
	r.proxy = &httputil.ReverseProxy{
		Rewrite:        rewrite,
		Transport:      r.tr,
		FlushInterval:  -1, // stream (server-sent events, chunked pages) as it comes
		ModifyResponse: r.modifyResponse,
		ErrorHandler:   r.fail,
		ErrorLog:       slog.NewLogLogger(r.log.Handler(), slog.LevelDebug),
	}
	return r
}

// Start runs the loop that forgets expired previews.
func (r *Router) Start(ctx context.Context) error {
	return r.Base.Run(ctx, func(ctx context.Context) {
		lifecycle.Every(r.clock, sweepInterval, func(context.Context) { r.sweep(r.clock.Now(), false) })(ctx)
		r.sweep(r.clock.Now(), true)
	})
}

// sweep forgets the previews expired at now (all of them when stopping)
// and ends their streams.
func (r *Router) sweep(now time.Time, stopping bool) {
	var ending []io.Closer
	r.mu.Lock()
	r.stopping = r.stopping || stopping
	for id, t := range r.targets {
		if stopping || !now.Before(t.Expires) {
			for c := range t.streams {
				ending = append(ending, c)
			}
			delete(r.targets, id)
		}
	}
	r.mu.Unlock()
	for _, c := range ending {
		c.Close()
	}
	r.tr.CloseIdleConnections()
}

// poolHost names a preview's connections in the transport's pool: the
// requests to one preview URL share them, and no two URLs do.
func poolHost(id string) string { return id + ".preview.invalid" }

type (
	targetKey  struct{}
	browserKey struct{}
)

// Serve serves a request to the preview whose capability is label
// (Domain.Match of its Host).
func (r *Router) Serve(w http.ResponseWriter, req *http.Request, label string) {
	t, err := r.svc.Resolve(req.Context(), label)
	if err != nil {
		if !errors.Is(err, ErrInvalid) {
			r.log.Error("resolve a preview", "err", err)
			page(w, http.StatusServiceUnavailable, "The preview cannot be served right now. Try again shortly.")
			return
		}
		page(w, http.StatusForbidden, "This preview link is invalid or has expired. Ask for a new one (get_preview_url).")
		return
	}
	rt, ok := r.route(t)
	if !ok {
		page(w, http.StatusServiceUnavailable, "The service is shutting down.")
		return
	}
	if !rt.limiter.Allow() {
		w.Header().Set("Retry-After", "1")
		page(w, http.StatusTooManyRequests, "Too many requests to this preview; slow down.")
		return
	}
	if req.ContentLength > r.limits.MaxRequest {
		page(w, http.StatusRequestEntityTooLarge, fmt.Sprintf("The request body is larger than %d bytes.", r.limits.MaxRequest))
		return
	}
	ctx := context.WithValue(req.Context(), targetKey{}, rt)
	rc := http.NewResponseController(w)
	pw := &previewWriter{ResponseWriter: w, rc: rc, stall: r.limits.WriteStall}
	// A request to upgrade holds a place among the open streams from now
	// until its stream ends (the proxy serves a stream to its end) or it
	// is answered without one.
	if httpguts.HeaderValuesContainsToken(req.Header["Connection"], "upgrade") {
		release, status, msg := r.openStream(rt)
		if release == nil {
			if status == http.StatusTooManyRequests {
				w.Header().Set("Retry-After", "10")
			}
			page(w, status, msg)
			return
		}
		defer release()
		pw.browser = &browserConn{}
		ctx = context.WithValue(ctx, browserKey{}, pw.browser)
	}
	if req.Body == nil || req.Body == http.NoBody || req.ContentLength == 0 {
		// Nothing to read: the response may stream as long as it lasts.
		_ = rc.SetReadDeadline(time.Time{})
	} else {
		req.Body = &bodyDone{ReadCloser: http.MaxBytesReader(w, req.Body, r.limits.MaxRequest), done: func() { _ = rc.SetReadDeadline(time.Time{}) }}
	}
	r.proxy.ServeHTTP(pw, req.WithContext(ctx))
}

// route returns what the router keeps for t, made on first use; false
// once the router stops.
func (r *Router) route(t Target) (*routed, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.stopping {
		return nil, false
	}
	rt, ok := r.targets[t.ID]
	if !ok {
		rt = &routed{Target: t, limiter: rate.NewLimiter(rate.Limit(r.limits.Rate), 2*r.limits.Rate),
			streams: map[io.Closer]struct{}{}}
		r.targets[t.ID] = rt
	}
	return rt, true
}

// openStream takes a place for an upgraded stream to rt's conversation
// and returns what gives it back; with no place left, nil and the status
// and page that say why.
func (r *Router) openStream(rt *routed) (release func(), status int, msg string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	switch {
	case r.convOpen[rt.Conversation] >= r.limits.MaxStreamsPerConversation:
		return nil, http.StatusTooManyRequests, fmt.Sprintf(
			"This sandbox's server has %d streams (WebSockets) open through its previews, the most it may; close one and try again.",
			r.limits.MaxStreamsPerConversation)
	case r.streams >= r.limits.MaxStreams:
		return nil, http.StatusServiceUnavailable, "This server holds as many preview streams (WebSockets) as it serves at once; try again later."
	}
	r.streams++
	r.convOpen[rt.Conversation]++
	var once sync.Once
	return func() {
		once.Do(func() {
			r.mu.Lock()
			defer r.mu.Unlock()
			r.streams--
			if r.convOpen[rt.Conversation]--; r.convOpen[rt.Conversation] == 0 {
				delete(r.convOpen, rt.Conversation)
			}
		})
	}, 0, ""
}

// track adds or removes an upgraded connection of rt, to end at its
// expiry; false when rt is forgotten already.
func (r *Router) track(rt *routed, c io.Closer, add bool) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if !add {
		delete(rt.streams, c)
		return true
	}
	if r.targets[rt.ID] != rt {
		return false
	}
	rt.streams[c] = struct{}{}
	return true
}

// dial is the transport's: a stream to the preview's port, through the
// executor that holds its sandbox.
func (r *Router) dial(ctx context.Context, _, addr string) (net.Conn, error) {
	rt, ok := ctx.Value(targetKey{}).(*routed)
	if !ok || addr != poolHost(rt.ID)+":80" {
		return nil, errors.New("preview: dial without its preview")
	}
	return r.link.Dial(ctx, rt.Executor, rt.Conversation, rt.Port, rt.Sandboxes)
}

// Headers never passed on: the api's credentials, and runbox's own.
var dropRequest = []string{"Authorization", "Proxy-Authorization"}

// rewrite points a request at its preview's connections and takes off
// what must not reach the sandbox.
func rewrite(pr *httputil.ProxyRequest) {
	rt := pr.In.Context().Value(targetKey{}).(*routed)
	pr.Out.URL.Scheme = "http"
	pr.Out.URL.Host = poolHost(rt.ID)
	// The server sees the name the browser used (frameworks build links
	// from it) and, in X-Forwarded-*, the scheme.
	pr.Out.Host = pr.In.Host
	pr.SetXForwarded()
	for _, h := range dropRequest {
		pr.Out.Header.Del(h)
	}
	dropRunboxHeaders(pr.Out.Header)
	dropRunboxCookies(pr.Out)
}

func dropRunboxHeaders(h http.Header) {
	for k := range h {
		if strings.HasPrefix(strings.ToLower(k), "x-runbox-") {
			delete(h, k)
		}
	}
}

// dropRunboxCookies takes off cookies the service's own parts may have
// set on a parent domain (names starting "runbox"); the preview's own
// cookies go through.
func dropRunboxCookies(r *http.Request) {
	cookies := r.Cookies()
	if len(cookies) == 0 {
		return
	}
	r.Header.Del("Cookie")
	for _, c := range cookies {
		if !strings.HasPrefix(strings.ToLower(strings.TrimPrefix(c.Name, "__Host-")), "runbox") {
			r.AddCookie(c)
		}
	}
}

// modifyResponse bounds a response and keeps it to its own origin.
func (r *Router) modifyResponse(resp *http.Response) error {
	dropRunboxHeaders(resp.Header)
	hostOnlyCookies(resp.Header)
	// Clear-Site-Data's "cookies" clears the cookies of the whole
	// registrable domain, every other preview's (and, on a shared
	// domain, more) with them.
	resp.Header.Del("Clear-Site-Data")
	rt := resp.Request.Context().Value(targetKey{}).(*routed)
	if resp.StatusCode == http.StatusSwitchingProtocols {
		back, ok := resp.Body.(io.ReadWriteCloser)
		if !ok {
			return errors.New("preview: an upgraded response without a stream")
		}
		browser, _ := resp.Request.Context().Value(browserKey{}).(*browserConn)
		s := &stream{rw: back, browser: browser, max: r.limits.MaxResponse}
		if !r.track(rt, s, true) {
			return errors.New("preview: expired")
		}
		s.untrack = func() { r.track(rt, s, false) }
		s.idleAfter(r.clock, r.limits.StreamIdle)
		resp.Body = s
		return nil
	}
	if resp.ContentLength > r.limits.MaxResponse {
		return errTooLarge
	}
	resp.Body = &limitedBody{ReadCloser: resp.Body, left: r.limits.MaxResponse}
	return nil
}

var errTooLarge = errors.New("preview: response too large")

// hostOnlyCookies drops the Domain attribute of the cookies a preview
// sets: one preview must not set cookies on the domain every other
// preview (and perhaps the api) shares.
func hostOnlyCookies(h http.Header) {
	set := h.Values("Set-Cookie")
	if len(set) == 0 {
		return
	}
	h.Del("Set-Cookie")
	for _, line := range set {
		parts := strings.Split(line, ";")
		kept := parts[:1]
		for _, p := range parts[1:] {
			name, _, _ := strings.Cut(strings.TrimSpace(p), "=")
			if !strings.EqualFold(name, "domain") {
				kept = append(kept, p)
			}
		}
		h.Add("Set-Cookie", strings.Join(kept, ";"))
	}
}

// fail answers a request the proxy could not complete.
func (r *Router) fail(w http.ResponseWriter, req *http.Request, err error) {
	rt, _ := req.Context().Value(targetKey{}).(*routed)
	switch {
	case errors.Is(err, link.ErrGone):
		page(w, http.StatusGone, "This preview is gone: the sandbox that served it has ended (its run finished or was cancelled, the session was closed, or it expired).")
	case errors.Is(err, link.ErrNotListening):
		page(w, http.StatusBadGateway, fmt.Sprintf("Nothing listens on port %d in the sandbox right now.", rt.Port))
	case errors.Is(err, errTooLarge):
		page(w, http.StatusBadGateway, fmt.Sprintf("The preview's response is larger than %d bytes.", r.limits.MaxResponse))
	case req.Context().Err() != nil:
		// The browser went away.
	default:
		r.log.Debug("proxy a preview request", "preview", rt.ID, "err", err)
		page(w, http.StatusBadGateway, "The preview's server did not answer properly.")
	}
}

// page writes a short plain-text answer of the router's own.
func page(w http.ResponseWriter, status int, msg string) {
	h := w.Header()
	h.Set("Content-Type", "text/plain; charset=utf-8")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_, _ = io.WriteString(w, msg+"\n")
}

// previewWriter bounds each write to the client, and hands the proxy the
// client's connection for an upgrade without the server's deadlines.
type previewWriter struct {
	http.ResponseWriter
	rc    *http.ResponseController
	stall time.Duration
	// browser keeps the connection of a request to upgrade, once taken.
	browser *browserConn
}

func (w *previewWriter) Write(p []byte) (int, error) {
	_ = w.rc.SetWriteDeadline(time.Now().Add(w.stall))
	return w.ResponseWriter.Write(p)
}

func (w *previewWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// Hijack gives the proxy the connection of an upgraded request: it lives
// as long as the stream, which ends at the preview's expiry or when its
// sandbox does.
func (w *previewWriter) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	c, brw, err := w.rc.Hijack()
	if err != nil {
		return nil, nil, err
	}
	_ = c.SetDeadline(time.Time{})
	if w.browser != nil {
		w.browser.take(c)
	}
	return c, brw, nil
}

// browserConn is the browser's connection of an upgraded stream, for the
// stream to close when it ends. The proxy ends a stream once either side
// fails, but only once both sides have ended when they end cleanly; and
// closing the sandbox's side may end it cleanly one way only (a yamux
// stream's close is a half-close), so the proxy would wait on a browser
// that sends nothing — the stream held open, and its place too.
type browserConn struct {
	mu     sync.Mutex
	conn   net.Conn
	closed bool
}

// take keeps c, or closes it if the stream ended already.
func (b *browserConn) take(c net.Conn) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		c.Close()
		return
	}
	b.conn = c
}

func (b *browserConn) Close() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.closed = true
	if b.conn != nil {
		b.conn.Close()
	}
}

// stream is an upgraded connection to the sandbox, bounded in bytes each
// way and in the time it may carry nothing. Both directions pass
// through it (Read from the sandbox, Write to it), so either is activity.
// Its end closes the browser's connection too.
type stream struct {
	rw      io.ReadWriteCloser
	browser *browserConn // nil for an answer to a request that asked no upgrade (the proxy refuses it)
	max     int64
	mu      sync.Mutex
	in, out int64
	untrack func()
	once    sync.Once

	clock clockwork.Clock
	idle  time.Duration
	timer clockwork.Timer
	last  atomic.Int64 // the clock's UnixNano when a byte last passed
}

var errStreamLimit = errors.New("preview: stream limit reached")

// idleAfter ends the stream once nothing passed for idle.
func (s *stream) idleAfter(clock clockwork.Clock, idle time.Duration) {
	s.clock, s.idle = clock, idle
	s.last.Store(clock.Now().UnixNano())
	s.timer = clock.AfterFunc(idle, s.checkIdle)
}

// checkIdle closes an idle stream, or looks again when it would be.
func (s *stream) checkIdle() {
	quiet := s.clock.Since(time.Unix(0, s.last.Load()))
	if quiet >= s.idle {
		s.Close()
		return
	}
	s.timer.Reset(s.idle - quiet)
}

func (s *stream) active(n int) {
	if n > 0 && s.clock != nil {
		s.last.Store(s.clock.Now().UnixNano())
	}
}

func (s *stream) Read(p []byte) (int, error) {
	n, err := s.rw.Read(p)
	s.active(n)
	s.mu.Lock()
	s.in += int64(n)
	over := s.in > s.max
	s.mu.Unlock()
	if over {
		s.Close()
		return n, errStreamLimit
	}
	return n, err
}

func (s *stream) Write(p []byte) (int, error) {
	s.mu.Lock()
	s.out += int64(len(p))
	over := s.out > s.max
	s.mu.Unlock()
	if over {
		s.Close()
		return 0, errStreamLimit
	}
	// Marked before too: the far end may read these bytes, and answer,
	// before this write returns.
	s.active(len(p))
	n, err := s.rw.Write(p)
	s.active(n)
	return n, err
}

func (s *stream) Close() error {
	s.once.Do(func() {
		if s.timer != nil {
			s.timer.Stop()
		}
		if s.untrack != nil {
			s.untrack()
		}
		if s.browser != nil {
			s.browser.Close()
		}
	})
	return s.rw.Close()
}

// limitedBody ends a response body that goes past its bound; the proxy
// then aborts the response.
type limitedBody struct {
	io.ReadCloser
	left int64
}

func (b *limitedBody) Read(p []byte) (int, error) {
	if b.left <= 0 {
		// At the bound: the body may end here, or go past it.
		var one [1]byte
		n, err := b.ReadCloser.Read(one[:])
		if n > 0 {
			return 0, errTooLarge
		}
		return 0, err
	}
	if int64(len(p)) > b.left {
		p = p[:b.left]
	}
	n, err := b.ReadCloser.Read(p)
	b.left -= int64(n)
	return n, err
}

// bodyDone calls done once a request body has been read to its end.
type bodyDone struct {
	io.ReadCloser
	done func()
	once sync.Once
}

func (b *bodyDone) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if err == io.EOF {
		b.once.Do(b.done)
	}
	return n, err
}
