package preview

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
	"golang.org/x/net/websocket"

	"github.com/runbox-dev/runbox"
	"github.com/runbox-dev/runbox/internal/link"
	"github.com/runbox-dev/runbox/internal/store"
	"github.com/runbox-dev/runbox/internal/testenv"
)

// sandboxes is an executor's side whose ports are test servers.
type sandboxes struct {
	mu    sync.Mutex
	live  map[string][]string       // conversation → sandbox ids
	ports map[string]map[int]string // conversation → port → address
	// halfClose makes the connections' Close end only what they send, as
	// a yamux stream's does (link.Local, an executor in the api's process);
	// dialled keeps them, to close at the end of the test.
	halfClose bool
	dialled   []net.Conn
}

func (s *sandboxes) Sandboxes(conv string) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.live[conv]
}

func (s *sandboxes) set(conv string, ids ...string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.live[conv] = ids
}

func (s *sandboxes) DialPort(ctx context.Context, conv string, port int) (net.Conn, error) {
	s.mu.Lock()
	addr, ok := s.ports[conv][port]
	half := s.halfClose
	s.mu.Unlock()
	if !ok {
		return nil, link.ErrNotListening
	}
	var d net.Dialer
	c, err := d.DialContext(ctx, "tcp", addr)
	if err != nil || !half {
		return c, err
	}
	s.mu.Lock()
	s.dialled = append(s.dialled, c)
	s.mu.Unlock()
	return halfClosing{c.(*net.TCPConn)}, nil
}

func (s *sandboxes) closeAll() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, c := range s.dialled {
		c.Close()
	}
}

// halfClosing is a connection whose Close ends only what it sends.
type halfClosing struct{ *net.TCPConn }

func (c halfClosing) Close() error { return c.CloseWrite() }

func (s *sandboxes) WriteFiles(context.Context, string, []link.File) error { return nil }
func (s *sandboxes) Output(string) (link.Output, bool)                     { return link.Output{}, false }

// probe lets a test see what the app's WebSockets receive (sink) and
// make one send (push); done ends the deaf ones.
type probe struct {
	got  chan string
	push chan string
	done chan struct{}
}

// app is the server "in the sandbox".
func app(p *probe) http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Add("Set-Cookie", "theme=dark; Domain=localhost; Path=/")
		w.Header().Set("X-Runbox-Executor", "leak")
		w.Header().Set("Clear-Site-Data", `"cookies", "storage"`)
		fmt.Fprint(w, "hello from the sandbox")
	})
	// Streams one way each: what the browser sends, what the server sends.
	mux.Handle("/sink", websocket.Handler(func(c *websocket.Conn) {
		var m string
		for websocket.Message.Receive(c, &m) == nil {
			p.got <- m
		}
	}))
	mux.Handle("/push", websocket.Handler(func(c *websocket.Conn) {
		for m := range p.push {
			if websocket.Message.Send(c, m) != nil {
				return
			}
		}
	}))
	mux.HandleFunc("/headers", func(w http.ResponseWriter, r *http.Request) {
		_ = json.NewEncoder(w).Encode(map[string]any{"host": r.Host, "header": r.Header})
	})
	mux.HandleFunc("/big", func(w http.ResponseWriter, r *http.Request) {
		_, _ = w.Write(make([]byte, 2<<10))
	})
	mux.HandleFunc("/upload", func(w http.ResponseWriter, r *http.Request) {
		n, _ := io.Copy(io.Discard, r.Body)
		fmt.Fprint(w, n)
	})
	mux.Handle("/ws", websocket.Handler(func(c *websocket.Conn) { _, _ = io.Copy(c, c) }))
	// Never reads, so never sees an end: as a server that only pushes.
	mux.Handle("/deaf", websocket.Handler(func(*websocket.Conn) { <-p.done }))
	return mux
}

type fixture struct {
	probe   *probe
	svc     *Service
	router  *Router
	sb      *sandboxes
	backend *httptest.Server
	front   *httptest.Server
	clock   *clockwork.FakeClock
	domain  Domain
	client  *http.Client
}

func newFixture(t *testing.T, limits Limits) *fixture {
	t.Helper()
	_, u := testenv.Miniredis(t)
	st := store.New(store.NewConn(testenv.Client(t, u)))
	ctx := context.Background()
	if err := st.Heartbeat(ctx, runbox.ExecutorInfo{ID: "ex1"}, time.Hour); err != nil {
		t.Fatal(err)
	}
	f := &fixture{clock: clockwork.NewFakeClockAt(time.Now()), probe: &probe{got: make(chan string, 16), push: make(chan string), done: make(chan struct{})}}
	f.backend = httptest.NewServer(app(f.probe))
	t.Cleanup(f.backend.Close)
	t.Cleanup(func() { close(f.probe.done) })
	f.sb = &sandboxes{live: map[string][]string{"c1": {"sb1"}, "c3": {"sb3"}, "~other~c1": {"sb9"}},
		ports: map[string]map[int]string{"c1": {8000: f.backend.Listener.Addr().String()}, "c3": {8000: f.backend.Listener.Addr().String()}}}
	t.Cleanup(f.sb.closeAll)
	f.domain, _ = ParseDomain("localhost:8080", "http")
	l := link.Local{ID: "ex1", Backend: f.sb}
	f.svc = NewService(Options{Key: Key([]byte("the deployment's shared secret")), Domain: f.domain, TTL: time.Hour,
		Store: st, Link: l, Now: f.clock.Now})
	f.router = NewRouter(f.svc, l, limits, f.clock, nil)
	if err := f.router.Start(ctx); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(f.router.Stop)
	f.front = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		label, preview := f.domain.Match(r.Host)
		if !preview {
			w.WriteHeader(http.StatusTeapot) // the api would serve it
			return
		}
		f.router.Serve(w, r, label)
	}))
	t.Cleanup(f.front.Close)
	front := f.front.Listener.Addr().String()
	f.client = &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		var d net.Dialer
		return d.DialContext(ctx, "tcp", front)
	}}}
	return f
}

var defaultLimits = Limits{MaxRequest: 1 << 10, MaxResponse: 1 << 10, Rate: 1000, WriteStall: 10 * time.Second}

func (f *fixture) get(t *testing.T, rawURL string, hdr http.Header) (int, http.Header, string) {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, rawURL, nil)
	for k, v := range hdr {
		req.Header[k] = v
	}
	resp, err := f.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header, string(b)
}

func TestIssue(t *testing.T) {
	f := newFixture(t, defaultLimits)
	ctx := context.Background()
	u, err := f.svc.Issue(ctx, "c1", 8000)
	if err != nil {
		t.Fatal(err)
	}
	parsed, _ := url.Parse(u.URL)
	label, preview := f.domain.Match(parsed.Host)
	if !preview || len(label) != LabelLen || parsed.Port() != "8080" || parsed.Path != "/" {
		t.Errorf("url %s", u.URL)
	}
	if !u.ExpiresAt.Equal(f.clock.Now().Add(time.Hour).Truncate(time.Second)) {
		t.Errorf("expires %v", u.ExpiresAt)
	}
	if _, err := f.svc.Issue(ctx, "c1", 8001); err == nil || !strings.Contains(err.Error(), runbox.ENotListening) {
		t.Errorf("a port nothing listens on: %v", err)
	}
	if _, err := f.svc.Issue(ctx, "c2", 8000); err == nil || !strings.Contains(err.Error(), runbox.ENotListening) {
		t.Errorf("a conversation without a sandbox: %v", err)
	}
	// Another client's conversation of the same id is another conversation.
	if _, err := f.svc.Issue(ctx, "~other~c1", 8000); err == nil || !strings.Contains(err.Error(), runbox.ENotListening) {
		t.Errorf("another client's conversation: %v", err)
	}
	for _, port := range []int{0, -1, 65536} {
		if _, err := f.svc.Issue(ctx, "c1", port); err == nil || !strings.Contains(err.Error(), "invalid_argument") {
			t.Errorf("port %d: %v", port, err)
		}
	}
}

func TestRouter(t *testing.T) {
	f := newFixture(t, defaultLimits)
	ctx := context.Background()
	u, err := f.svc.Issue(ctx, "c1", 8000)
	if err != nil {
		t.Fatal(err)
	}
	base := strings.TrimSuffix(u.URL, "/")

	code, hdr, body := f.get(t, u.URL, nil)
	if code != http.StatusOK || body != "hello from the sandbox" {
		t.Fatalf("GET / = %d %q", code, body)
	}
	if hdr.Get("X-Runbox-Executor") != "" {
		t.Error("a runbox header of the sandbox's reached the browser")
	}
	if c := hdr.Get("Set-Cookie"); c != "theme=dark; Path=/" {
		t.Errorf("cookie %q: a preview's cookies must stay host-only", c)
	}
	if c := hdr.Get("Clear-Site-Data"); c != "" {
		t.Errorf("Clear-Site-Data %q reached the browser: it clears the cookies of every preview", c)
	}

	code, _, body = f.get(t, base+"/headers", http.Header{
		"Authorization": {"Bearer the-api-token"}, "Cookie": {"runbox_session=s; theme=dark"},
		"X-Runbox-Client": {"admin"},
	})
	var seen struct {
		Host   string
		Header http.Header
	}
	if code != http.StatusOK || json.Unmarshal([]byte(body), &seen) != nil {
		t.Fatalf("GET /headers = %d %q", code, body)
	}
	if seen.Header.Get("Authorization") != "" || seen.Header.Get("X-Runbox-Client") != "" {
		t.Errorf("credentials reached the sandbox: %v", seen.Header)
	}
	if c := seen.Header.Get("Cookie"); c != "theme=dark" {
		t.Errorf("cookie %q reached the sandbox", c)
	}
	if parsed, _ := url.Parse(u.URL); seen.Host != parsed.Host || seen.Header.Get("X-Forwarded-Proto") != "http" {
		t.Errorf("host %q, forwarded %v", seen.Host, seen.Header)
	}

	// Bounds.
	req, _ := http.NewRequest(http.MethodPost, base+"/upload", strings.NewReader(strings.Repeat("x", 2<<10)))
	if resp, err := f.client.Do(req); err != nil || resp.StatusCode != http.StatusRequestEntityTooLarge {
		t.Errorf("a body over the bound: %v %v", resp, err)
	} else {
		resp.Body.Close()
	}
	if code, _, _ := f.get(t, base+"/big", nil); code != http.StatusBadGateway {
		t.Errorf("a response over the bound: %d", code)
	}

	// Altered, other-port and expired capabilities are refused.
	label, _ := f.domain.Match(mustHost(u.URL))
	raw, _ := encoding.DecodeString(label)
	raw[6]++ // the port's low byte
	otherPort := encoding.EncodeToString(raw)
	flip := byte('a')
	if label[10] == flip {
		flip = 'b'
	}
	flipped := label[:10] + string(flip) + label[11:]
	for name, l := range map[string]string{"altered": flipped, "other port": otherPort, "malformed": "x" + label[1:30]} {
		if code, _, _ := f.get(t, f.domain.URL(l), nil); code != http.StatusForbidden {
			t.Errorf("%s: %d", name, code)
		}
	}
	if code, _, _ := f.get(t, "http://a.b.localhost:8080/", nil); code != http.StatusForbidden {
		t.Errorf("a name under the domain that is no capability: %d", code)
	}
	if code, _, _ := f.get(t, "http://localhost:8080/", nil); code != http.StatusTeapot {
		t.Errorf("the api host reached the preview router: %d", code)
	}

	// The sandbox ends (or is recycled): gone, even though a new one of
	// the conversation listens on the same port.
	f.sb.set("c1", "sb2")
	f.backend.CloseClientConnections()
	if code, _, body := f.get(t, u.URL, nil); code != http.StatusGone || !strings.Contains(body, "gone") {
		t.Errorf("after its sandbox ended: %d %q", code, body)
	}

	u2, err := f.svc.Issue(ctx, "c1", 8000)
	if err != nil {
		t.Fatal(err)
	}
	if code, _, _ := f.get(t, u2.URL, nil); code != http.StatusOK {
		t.Fatalf("a new URL for the new sandbox: %d", code)
	}
	f.clock.Advance(time.Hour)
	if code, _, _ := f.get(t, u2.URL, nil); code != http.StatusForbidden {
		t.Errorf("expired: %d", code)
	}
}

func mustHost(raw string) string {
	u, _ := url.Parse(raw)
	return u.Host
}

func TestRouterRate(t *testing.T) {
	f := newFixture(t, Limits{MaxRequest: 1 << 10, MaxResponse: 1 << 10, Rate: 5, WriteStall: 10 * time.Second})
	u, err := f.svc.Issue(context.Background(), "c1", 8000)
	if err != nil {
		t.Fatal(err)
	}
	limited := 0
	for range 30 {
		if code, _, _ := f.get(t, u.URL, nil); code == http.StatusTooManyRequests {
			limited++
		}
	}
	// A burst of twice the rate passes; 30 at once cannot all.
	if limited == 0 || limited > 30-10 {
		t.Errorf("%d of 30 requests limited at 5/s", limited)
	}
}

func TestRouterWebSocket(t *testing.T) {
	f := newFixture(t, Limits{MaxRequest: 1 << 10, MaxResponse: 4 << 10, Rate: 100, WriteStall: 10 * time.Second})
	u, err := f.svc.Issue(context.Background(), "c1", 8000)
	if err != nil {
		t.Fatal(err)
	}
	dial := func() *websocket.Conn {
		t.Helper()
		cfg, err := websocket.NewConfig(strings.Replace(u.URL, "http://", "ws://", 1)+"ws", u.URL)
		if err != nil {
			t.Fatal(err)
		}
		raw, err := net.Dial("tcp", f.front.Listener.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		ws, err := websocket.NewClient(cfg, raw)
		if err != nil {
			t.Fatal(err)
		}
		return ws
	}
	ws := dial()
	defer ws.Close()
	for i := range 5 {
		msg := fmt.Sprintf("message %d", i)
		if err := websocket.Message.Send(ws, msg); err != nil {
			t.Fatal(err)
		}
		var got string
		if err := websocket.Message.Receive(ws, &got); err != nil || got != msg {
			t.Fatalf("echo: %q %v", got, err)
		}
	}
	// Past its bound in bytes a stream ends.
	_ = websocket.Message.Send(ws, strings.Repeat("y", 5<<10))
	var got string
	_ = ws.SetReadDeadline(time.Now().Add(10 * time.Second))
	if err := websocket.Message.Receive(ws, &got); err == nil {
		t.Error("a stream went past its bound")
	}

	// A preview's streams end when it expires.
	ws2 := dial()
	defer ws2.Close()
	if err := websocket.Message.Send(ws2, "hi"); err != nil {
		t.Fatal(err)
	}
	_ = websocket.Message.Receive(ws2, &got)
	f.clock.Advance(time.Hour)
	_ = ws2.SetReadDeadline(time.Now().Add(10 * time.Second))
	if err := websocket.Message.Receive(ws2, &got); err == nil {
		t.Error("a stream outlived its preview")
	}
}

// TestRouterSite: what the router can do to keep previews, which share a
// registrable domain, out of each other's cookies — a preview's
// Set-Cookie loses its Domain, its Clear-Site-Data is taken off, the
// service's own cookies never reach it — and what it cannot: a cookie
// that one preview's script set for the parent domain reaches another
// preview's server like that preview's own (a request does not say who
// set a cookie). Hence PREVIEW_BASE_DOMAIN on a domain of the Public
// Suffix List in production (docs/tools.md, "Previews"): browsers then refuse such cookies.
func TestRouterSite(t *testing.T) {
	f := newFixture(t, defaultLimits)
	u, err := f.svc.Issue(context.Background(), "c1", 8000)
	if err != nil {
		t.Fatal(err)
	}
	_, hdr, _ := f.get(t, u.URL, nil)
	if hdr.Get("Set-Cookie") != "theme=dark; Path=/" || hdr.Get("Clear-Site-Data") != "" {
		t.Errorf("response headers %v", hdr)
	}
	// "planted" stands for a cookie a sibling preview's script set with
	// Domain=localhost: the browser sends it here as it sends "theme".
	_, _, body := f.get(t, strings.TrimSuffix(u.URL, "/")+"/headers", http.Header{"Cookie": {"runbox_token=t; theme=dark; planted=1"}})
	var seen struct{ Header http.Header }
	if err := json.Unmarshal([]byte(body), &seen); err != nil {
		t.Fatal(err)
	}
	if c := seen.Header.Get("Cookie"); c != "theme=dark; planted=1" {
		t.Errorf("cookies the preview's server got: %q", c)
	}
}

// upgrade asks a preview for a WebSocket at path and returns the status
// and, for 101, the connection.
func (f *fixture) upgrade(t *testing.T, previewURL, path string) (int, *websocket.Conn) {
	t.Helper()
	cfg, err := websocket.NewConfig(strings.Replace(previewURL, "http://", "ws://", 1)+path, previewURL)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := net.Dial("tcp", f.front.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	ws, err := websocket.NewClient(cfg, raw)
	if err == nil {
		t.Cleanup(func() { ws.Close() })
		return http.StatusSwitchingProtocols, ws
	}
	raw.Close()
	// Ask again by hand for the status the handshake refused.
	req, _ := http.NewRequest(http.MethodGet, previewURL+path, nil)
	req.Header.Set("Connection", "Upgrade")
	req.Header.Set("Upgrade", "websocket")
	req.Header.Set("Sec-WebSocket-Version", "13")
	req.Header.Set("Sec-WebSocket-Key", "dGhlIHNhbXBsZSBub25jZQ==")
	resp, err := f.client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode == http.StatusSwitchingProtocols {
		t.Fatalf("%s: the handshake failed (%v) but the upgrade was taken", path, err)
	}
	return resp.StatusCode, nil
}

// TestRouterStreamIdle: an upgraded stream that carries no byte either
// way for PREVIEW_WS_IDLE ends, at the browser too, whatever the server
// does and however the sandbox's side closes; bytes one way only keep
// one alive, in either direction.
func TestRouterStreamIdle(t *testing.T) {
	for _, tc := range []struct {
		name      string
		halfClose bool
	}{
		{"the sandbox's side closes (a link through an executor elsewhere)", false},
		{"the sandbox's side half-closes (a yamux stream, an executor in this process)", true},
	} {
		t.Run(tc.name, func(t *testing.T) { testRouterStreamIdle(t, tc.halfClose) })
	}
}

// openStreams counts the upgraded streams the router holds places for.
func (r *Router) openStreams() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.streams
}

func testRouterStreamIdle(t *testing.T, halfClose bool) {
	const idle = time.Minute
	f := newFixture(t, Limits{MaxRequest: 1 << 10, MaxResponse: 1 << 20, Rate: 100, WriteStall: 10 * time.Second, StreamIdle: idle})
	f.sb.halfClose = halfClose
	u, err := f.svc.Issue(context.Background(), "c1", 8000)
	if err != nil {
		t.Fatal(err)
	}
	_, sink := f.upgrade(t, u.URL, "sink")
	_, push := f.upgrade(t, u.URL, "push")
	// Quiet: a server that echoes (and so sees the end), and one that
	// never reads.
	_, quiet := f.upgrade(t, u.URL, "ws")
	_, deaf := f.upgrade(t, u.URL, "deaf")
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	// Each stream's idle timer, and the router's sweep.
	waiters := func(n int) {
		t.Helper()
		if err := f.clock.BlockUntilContext(ctx, n); err != nil {
			t.Fatalf("waiting for %d timers: %v", n, err)
		}
	}
	waiters(5)
	traffic := func() {
		t.Helper()
		if err := websocket.Message.Send(sink, "up"); err != nil {
			t.Fatal(err)
		}
		select {
		case <-f.probe.got:
		case <-ctx.Done():
			t.Fatal("the sink got nothing")
		}
		select {
		case f.probe.push <- "down":
		case <-ctx.Done():
			t.Fatal("nothing pushes")
		}
		var m string
		_ = push.SetReadDeadline(time.Now().Add(30 * time.Second))
		if err := websocket.Message.Receive(push, &m); err != nil || m != "down" {
			t.Fatalf("push: %q %v", m, err)
		}
	}
	closed := func(ws *websocket.Conn) bool {
		var m string
		_ = ws.SetReadDeadline(time.Now().Add(30 * time.Second))
		err := websocket.Message.Receive(ws, &m)
		return err != nil && !errors.Is(err, os.ErrDeadlineExceeded)
	}
	// Traffic every 2/3 of the idle time: the quiet stream's time comes
	// at the second step, the others' timers look again and wait on.
	for range 3 {
		traffic()
		f.clock.Advance(idle * 2 / 3)
		waiters(1 + 2)
	}
	if !closed(quiet) {
		t.Error("a stream idle both ways lived on")
	}
	if !closed(deaf) {
		t.Error("a stream idle both ways to a server that never reads lived on")
	}
	// Their places came back: the proxy let them go.
	for open := f.router.openStreams(); open != 2; open = f.router.openStreams() {
		if ctx.Err() != nil {
			t.Fatalf("%d streams held, want 2", open)
		}
		time.Sleep(10 * time.Millisecond)
	}
	traffic() // the others still carry
	f.clock.Advance(idle + time.Second)
	if !closed(sink) || !closed(push) {
		t.Error("streams lived on once idle")
	}
}

// TestRouterStreamCaps: upgraded streams are bounded per conversation
// (whatever the URL) and per process; a refusal says which, and a place
// comes back when a stream ends. Plain requests are not counted.
func TestRouterStreamCaps(t *testing.T) {
	f := newFixture(t, Limits{MaxRequest: 1 << 10, MaxResponse: 1 << 20, Rate: 100, WriteStall: 10 * time.Second,
		MaxStreams: 3, MaxStreamsPerConversation: 2})
	ctx := context.Background()
	issue := func(conv string) string {
		u, err := f.svc.Issue(ctx, conv, 8000)
		if err != nil {
			t.Fatal(err)
		}
		return u.URL
	}
	a1, a2, b := issue("c1"), issue("c1"), issue("c3")
	if code, _ := f.upgrade(t, a1, "ws"); code != http.StatusSwitchingProtocols {
		t.Fatalf("first: %d", code)
	}
	code, first := f.upgrade(t, a2, "ws")
	if code != http.StatusSwitchingProtocols {
		t.Fatalf("second: %d", code)
	}
	if code, _ := f.upgrade(t, a2, "ws"); code != http.StatusTooManyRequests {
		t.Errorf("a third stream to the conversation: %d", code)
	}
	if code, _ := f.upgrade(t, b, "ws"); code != http.StatusSwitchingProtocols {
		t.Fatalf("another conversation's: %d", code)
	}
	if code, _ := f.upgrade(t, b, "ws"); code != http.StatusServiceUnavailable {
		t.Errorf("past the process's streams: %d", code)
	}
	if code, _, _ := f.get(t, a1, nil); code != http.StatusOK {
		t.Errorf("a plain request at the caps: %d", code)
	}
	first.Close()
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		code, _ := f.upgrade(t, b, "ws")
		if code == http.StatusSwitchingProtocols {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("a place did not come back: %d", code)
		}
	}
}
