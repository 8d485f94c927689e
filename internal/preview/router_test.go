package preview

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
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
	s.mu.Unlock()
	if !ok {
		return nil, link.ErrNotListening
	}
	var d net.Dialer
	return d.DialContext(ctx, "tcp", addr)
}

func (s *sandboxes) WriteFiles(context.Context, string, []link.File) error { return nil }
func (s *sandboxes) Output(string) (link.Output, bool)                     { return link.Output{}, false }

// app is the server "in the sandbox".
func app() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Add("Set-Cookie", "theme=dark; Domain=localhost; Path=/")
		w.Header().Set("X-Runbox-Executor", "leak")
		fmt.Fprint(w, "hello from the sandbox")
	})
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
	return mux
}

type fixture struct {
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
	st := store.New(testenv.Client(t, u))
	ctx := context.Background()
	if err := st.Heartbeat(ctx, store.ExecutorInfo{ID: "ex1"}, time.Hour); err != nil {
		t.Fatal(err)
	}
	f := &fixture{clock: clockwork.NewFakeClockAt(time.Now()), backend: httptest.NewServer(app())}
	t.Cleanup(f.backend.Close)
	f.sb = &sandboxes{live: map[string][]string{"c1": {"sb1"}, "~other~c1": {"sb9"}},
		ports: map[string]map[int]string{"c1": {8000: f.backend.Listener.Addr().String()}}}
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
