package e2e

import (
	"context"
	"encoding/base32"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"golang.org/x/net/websocket"

	"github.com/runbox-dev/runbox/internal/bench"
)

// pythonServer serves /data, with an index.html it writes, on 8000.
var pythonServer = bench.PythonPageServer(1 << 10)

// background starts a server with run_code background: true and returns
// its run id once it runs on.
func background(t *testing.T, cs *mcp.ClientSession, lang, conv, code string) string {
	t.Helper()
	var r struct {
		RunID   string `json:"run_id"`
		Running bool   `json:"running"`
		Output  string `json:"output"`
	}
	res := call(t, cs, "run_code", map[string]any{"language": lang, "code": code, "conversationId": conv, "background": true}, &r)
	if res.IsError || !r.Running || r.RunID == "" {
		t.Fatalf("background run_code: %s", text(res))
	}
	return r.RunID
}

// previewURL asks for a preview URL until the port listens.
func previewURL(t *testing.T, cs *mcp.ClientSession, conv string, port int) string {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		var u struct {
			URL       string    `json:"url"`
			ExpiresAt time.Time `json:"expires_at"`
			Error     string    `json:"error"`
		}
		res := call(t, cs, "get_preview_url", map[string]any{"conversationId": conv, "port": port}, &u)
		if !res.IsError {
			return u.URL
		}
		if u.Error != "not_listening" || time.Now().After(deadline) {
			t.Fatalf("get_preview_url: %s", text(res))
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// browser is an HTTP client whose every connection goes to the api's
// port, as a browser's does for <capability>.localhost:<port>.
func (s *service) browser() *http.Client {
	addr := strings.TrimPrefix(s.url, "http://")
	return &http.Client{
		Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "tcp", addr)
		}},
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
	}
}

func (s *service) browse(t *testing.T, rawURL string, hdr http.Header) (int, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, rawURL, nil)
	if err != nil {
		t.Fatal(err)
	}
	for k, v := range hdr {
		req.Header[k] = v
	}
	resp, err := s.browser().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// wsEcho sends messages over a WebSocket to a preview and checks each
// comes back.
func (s *service) wsEcho(t *testing.T, previewURL string, msgs ...string) {
	t.Helper()
	cfg, err := websocket.NewConfig(strings.Replace(previewURL, "http://", "ws://", 1)+"echo", previewURL)
	if err != nil {
		t.Fatal(err)
	}
	raw, err := net.Dial("tcp", strings.TrimPrefix(s.url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	ws, err := websocket.NewClient(cfg, raw)
	if err != nil {
		t.Fatalf("websocket through the preview: %v", err)
	}
	defer ws.Close()
	_ = ws.SetDeadline(time.Now().Add(30 * time.Second))
	for _, m := range msgs {
		if err := websocket.Message.Send(ws, m); err != nil {
			t.Fatal(err)
		}
		var got string
		if err := websocket.Message.Receive(ws, &got); err != nil || got != m {
			t.Fatalf("websocket echo: %q, %v; want %q", got, err, m)
		}
	}
}

// relabel returns u with its capability changed by f (decoded bytes).
func relabel(t *testing.T, u string, f func(b []byte)) string {
	t.Helper()
	parsed, _ := url.Parse(u)
	label, rest, _ := strings.Cut(parsed.Host, ".")
	enc := base32.NewEncoding("abcdefghijklmnopqrstuvwxyz234567").WithPadding(base32.NoPadding)
	b, err := enc.DecodeString(label)
	if err != nil {
		t.Fatal(err)
	}
	f(b)
	parsed.Host = enc.EncodeToString(b) + "." + rest
	return parsed.String()
}

// TestPreview: servers a conversation starts are reachable on preview
// URLs, HTTP and WebSocket, and on nothing else; URLs expire, cannot be
// altered or used by another client, and are gone with their sandbox.
func TestPreview(t *testing.T) {
	s := start(t, options{env: []string{"PREVIEW_URL_TTL=20s", "MCP_API_TOKENS=alice:" + aliceToken}})
	cs := s.session(nil)

	pyRun := background(t, cs, "python", "web", pythonServer)
	py := previewURL(t, cs, "web", 8000)
	if code, body := s.browse(t, py, nil); code != http.StatusOK || !strings.Contains(body, "python preview") {
		t.Fatalf("python preview: %d %q", code, body)
	}
	if !strings.HasPrefix(py, "http://") || !strings.Contains(py, ".localhost:") {
		t.Errorf("preview URL %s is not <capability>.localhost:<port>", py)
	}

	background(t, cs, "typescript", "node", bench.NodeEchoServer)
	node := previewURL(t, cs, "node", 3000)
	if code, body := s.browse(t, node+"a/b?c=d", nil); code != http.StatusOK || body != "hello from node /a/b?c=d" {
		t.Fatalf("node preview: %d %q", code, body)
	}
	s.wsEcho(t, node, "one", strings.Repeat("two", 100), strings.Repeat("x", 70000))

	// REST the same; nothing listens on another port.
	var rest struct {
		URL   string `json:"url"`
		Error string `json:"error"`
	}
	if code := s.request("POST", "/v1/conversations/web/previews", map[string]any{"port": 8000}, &rest); code != http.StatusCreated || rest.URL == "" {
		t.Errorf("REST preview: %d %+v", code, rest)
	}
	if code := s.request("POST", "/v1/conversations/web/previews", map[string]any{"port": 8001}, &rest); code != http.StatusConflict || rest.Error != "not_listening" {
		t.Errorf("REST preview of a port nothing listens on: %d %+v", code, rest)
	}
	var te toolError
	if res := call(t, cs, "get_preview_url", map[string]any{"conversationId": "web", "port": 9999}, &te); !res.IsError || te.Error != "not_listening" {
		t.Errorf("a port nothing listens on: %s", text(res))
	}

	// Another client's "web" is another conversation.
	alice := s.sessionAs(aliceToken)
	if res := call(t, alice, "get_preview_url", map[string]any{"conversationId": "web", "port": 8000}, &te); !res.IsError || te.Error != "not_listening" {
		t.Errorf("another client got a preview: %s", text(res))
	}

	// Altered and other-port capabilities are refused.
	for name, u := range map[string]string{
		"altered":    relabel(t, py, func(b []byte) { b[20] ^= 1 }),
		"other port": relabel(t, py, func(b []byte) { b[6]++ }),
		"later":      relabel(t, py, func(b []byte) { b[2]++ }),
	} {
		if code, _ := s.browse(t, u, nil); code != http.StatusForbidden {
			t.Errorf("%s capability: %d", name, code)
		}
	}

	// The preview host never reaches the api, MCP, downloads or the
	// playground; the api host never serves a preview.
	for _, path := range []string{"v1/runners", "mcp", "healthz", "files/web/index.html", "monitoring/"} {
		code, body := s.browse(t, py+path, http.Header{"Authorization": {"Bearer " + token}})
		if strings.Contains(body, "languages") || strings.Contains(body, `"status":"ok"`) || code == http.StatusUnauthorized {
			t.Errorf("the preview host served the api's /%s: %d %q", path, code, body)
		}
	}
	if code, body := s.browse(t, "http://not-a-capability.localhost:1/v1/runners", http.Header{"Authorization": {"Bearer " + token}}); code != http.StatusForbidden || strings.Contains(body, "languages") {
		t.Errorf("a name under the preview domain reached the api: %d %q", code, body)
	}
	if code, body := s.browse(t, s.url+"/", nil); code != http.StatusOK || strings.Contains(body, "python preview") {
		t.Errorf("the api host: %d", code)
	}

	// cancel_run ends the server's sandbox: its URL is gone.
	var cancelled struct {
		Status string `json:"status"`
	}
	call(t, cs, "cancel_run", map[string]any{"run_id": pyRun}, &cancelled)
	// cancel_run waits up to 5 s for the run to end; a loaded machine
	// may take longer to remove its sandbox.
	var code int
	var body string
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		if code, body = s.browse(t, py, nil); code == http.StatusGone || cancelled.Status == "cancelled" {
			break
		}
	}
	if code != http.StatusGone || !strings.Contains(body, "gone") {
		t.Errorf("after cancel_run (%s): %d %q", cancelled.Status, code, body)
	}
	// close_session too.
	call(t, cs, "close_session", map[string]any{"conversationId": "node"}, nil)
	if code, _ := s.browse(t, node, nil); code != http.StatusGone {
		t.Errorf("after close_session: %d", code)
	}

	// A URL expires (PREVIEW_URL_TTL=20s).
	background(t, cs, "python", "web2", pythonServer)
	u := previewURL(t, cs, "web2", 8000)
	if code, _ := s.browse(t, u, nil); code != http.StatusOK {
		t.Fatalf("fresh: %d", code)
	}
	time.Sleep(21 * time.Second)
	if code, _ := s.browse(t, u, nil); code != http.StatusForbidden {
		t.Errorf("expired: %d", code)
	}
}

// TestPreviewTwoExecutors: the api reaches the sandbox on whichever
// executor holds it.
func TestPreviewTwoExecutors(t *testing.T) {
	s := start(t, options{executors: 2})
	cs := s.session(nil)
	held := map[string]string{} // executor → conversation
	for i := 0; len(held) < 2 && i < 12; i++ {
		conv := fmt.Sprintf("two-%d", i)
		background(t, cs, "python", conv, pythonServer)
		u := previewURL(t, cs, conv, 8000)
		if code, body := s.browse(t, u, nil); code != http.StatusOK || !strings.Contains(body, "python preview") {
			t.Fatalf("%s: %d %q", conv, code, body)
		}
		// A conversation's runs stay on the executor of its live one.
		r := runCode(t, cs, map[string]any{"language": "bash", "code": "hostname", "conversationId": conv})
		held[s.containerExecutor(r.Stdout)] = conv
	}
	if len(held) < 2 {
		t.Errorf("the servers all ran on one executor: %v", held)
	}
}

// TestBackgroundIdle: a background program ends once idle (no output, no
// preview traffic) for SANDBOX_SERVER_TTL; a server that is browsed lives
// on. The executor is embedded: the api reaches it in its own process.
func TestBackgroundIdle(t *testing.T) {
	s := start(t, options{embedded: true, env: []string{"SANDBOX_SERVER_TTL=6s"}})
	cs := s.session(nil)
	quiet := background(t, cs, "python", "quiet", "import time\ntime.sleep(3600)\n")
	background(t, cs, "python", "browsed", pythonServer)
	u := previewURL(t, cs, "browsed", 8000)
	// Browsed every second for longer than the TTL.
	for range 12 {
		if code, _ := s.browse(t, u, nil); code != http.StatusOK {
			t.Fatalf("the browsed server: %d", code)
		}
		time.Sleep(time.Second)
	}
	var p struct {
		Status string `json:"status"`
		Events []struct {
			Type    string `json:"type"`
			Message string `json:"message"`
		} `json:"events"`
	}
	call(t, cs, "get_run", map[string]any{"run_id": quiet, "wait_seconds": 1}, &p)
	deadline := time.Now().Add(30 * time.Second)
	for p.Status == "running" && time.Now().Before(deadline) {
		call(t, cs, "get_run", map[string]any{"run_id": quiet, "wait_seconds": 5}, &p)
	}
	idle := false
	for _, ev := range p.Events {
		idle = idle || ev.Type == "timeout" && strings.Contains(ev.Message, "idle")
	}
	if p.Status != "timed_out" || !idle {
		t.Errorf("the quiet program: %+v", p)
	}
	if code, _ := s.browse(t, u, nil); code != http.StatusOK {
		t.Errorf("the browsed server after the quiet one ended: %d", code)
	}
}

// pythonPushServer serves WebSockets on 8000 with Python's standard
// library: /echo echoes, /push never reads and sends "news" to each
// stream at every GET /push, as a server that only pushes would (a live
// reload's). Every plain GET answers each stream's path and state:
// "open", or how it ended — "eof", "close", or "gone" once a push failed.
const pythonPushServer = `import base64, hashlib, http.server, json, signal, struct, threading

# As a plain python3 does (the runner's zygote gives programs the default).
signal.signal(signal.SIGPIPE, signal.SIG_IGN)
streams, lock = [], threading.Lock()

class Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = 'HTTP/1.1'

    def do_GET(self):
        if self.headers.get('Upgrade', '').lower() == 'websocket':
            return self.upgrade()
        with lock:
            for s in streams:
                if self.path == '/push' and s['path'] == '/push' and s['state'] == 'open':
                    try:
                        s['sock'].sendall(b'\x81\x04news')
                    except OSError as e:
                        s['state'] = 'gone (%s)' % type(e).__name__
            body = json.dumps([s['path'] + ' ' + s['state'] for s in streams]).encode()
        self.send_response(200)
        self.send_header('Content-Length', str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def upgrade(self):
        key = self.headers['Sec-WebSocket-Key'] + '258EAFA5-E914-47DA-95CA-C5AB0DC85B11'
        self.send_response(101)
        self.send_header('Upgrade', 'websocket')
        self.send_header('Connection', 'Upgrade')
        self.send_header('Sec-WebSocket-Accept', base64.b64encode(hashlib.sha1(key.encode()).digest()).decode())
        self.end_headers()
        self.wfile.flush()
        s = {'path': self.path, 'state': 'open', 'sock': self.connection}
        with lock:
            streams.append(s)
        if self.path == '/push':
            threading.Event().wait()
        end = self.echo()
        with lock:
            s['state'] = end
        self.close_connection = True

    def echo(self):
        r = self.rfile
        while True:
            h = r.read(2)
            if len(h) < 2:
                return 'eof'
            op, n = h[0] & 15, h[1] & 127
            if n == 126:
                n = struct.unpack('>H', r.read(2))[0]
            mask = r.read(4)
            data = bytes(b ^ mask[i % 4] for i, b in enumerate(r.read(n)))
            if op == 8:
                return 'close'
            head = bytes([0x80 | op, n]) if n < 126 else bytes([0x80 | op, 126]) + struct.pack('>H', n)
            self.wfile.write(head + data)
            self.wfile.flush()

print('serving', flush=True)
http.server.ThreadingHTTPServer(('0.0.0.0', 8000), Handler).serve_forever()
`

// TestPreviewStreams: through a real preview, a WebSocket ends once idle
// both ways for PREVIEW_WS_IDLE, end to end — at the browser, and at the
// sandbox's server, even one that never reads (the stream through the
// executor's link and the agent's connection to the server end with it)
// — while one that carries bytes lives on past it; a conversation holds
// at most PREVIEW_MAX_STREAMS_PER_CONVERSATION of them (429 past it, a
// place back once one ends), and the server's Clear-Site-Data never
// reaches the browser.
func TestPreviewStreams(t *testing.T) {
	const idle = 4 * time.Second
	s := start(t, options{env: []string{"PREVIEW_WS_IDLE=" + idle.String(), "PREVIEW_MAX_STREAMS_PER_CONVERSATION=2"}})
	cs := s.session(nil)
	server := strings.Replace(bench.NodeEchoServer, "(req, res) => res.end(", `(req, res) => res.setHeader('Clear-Site-Data', '"cookies"').end(`, 1)
	background(t, cs, "typescript", "streams", server)
	background(t, cs, "python", "pushes", pythonPushServer)
	u := previewURL(t, cs, "streams", 3000)
	py := previewURL(t, cs, "pushes", 8000)
	resp, err := s.browser().Get(u)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || resp.Header.Get("Clear-Site-Data") != "" {
		t.Errorf("GET: %d, Clear-Site-Data %q", resp.StatusCode, resp.Header.Get("Clear-Site-Data"))
	}

	// upgrade returns a WebSocket to path of a preview, or the status that
	// refused it.
	upgrade := func(base, path string) (*websocket.Conn, int) {
		t.Helper()
		cfg, _ := websocket.NewConfig(strings.Replace(base, "http://", "ws://", 1)+path, base)
		raw, err := net.Dial("tcp", strings.TrimPrefix(s.url, "http://"))
		if err != nil {
			t.Fatal(err)
		}
		if ws, err := websocket.NewClient(cfg, raw); err == nil {
			t.Cleanup(func() { ws.Close() })
			return ws, http.StatusSwitchingProtocols
		}
		raw.Close()
		req, _ := http.NewRequest(http.MethodGet, base+path, nil)
		for k, v := range map[string]string{"Connection": "Upgrade", "Upgrade": "websocket", "Sec-WebSocket-Version": "13",
			"Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ=="} {
			req.Header.Set(k, v)
		}
		resp, err := s.browser().Do(req)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		return nil, resp.StatusCode
	}
	echo := func(ws *websocket.Conn, m string) error {
		_ = ws.SetDeadline(time.Now().Add(30 * time.Second))
		if err := websocket.Message.Send(ws, m); err != nil {
			return err
		}
		var got string
		if err := websocket.Message.Receive(ws, &got); err != nil || got != m {
			return fmt.Errorf("echo %q: %q, %v", m, got, err)
		}
		return nil
	}
	// ended reports whether ws ended (rather than stayed open) within d.
	ended := func(ws *websocket.Conn, d time.Duration) bool {
		var m string
		_ = ws.SetReadDeadline(time.Now().Add(d))
		err := websocket.Message.Receive(ws, &m)
		return err != nil && !errors.Is(err, os.ErrDeadlineExceeded)
	}
	first, code := upgrade(u, "echo")
	second, code2 := upgrade(u, "echo")
	if code != http.StatusSwitchingProtocols || code2 != http.StatusSwitchingProtocols {
		t.Fatalf("two streams: %d %d", code, code2)
	}
	if _, code := upgrade(u, "echo"); code != http.StatusTooManyRequests {
		t.Errorf("a third stream to the conversation: %d", code)
	}
	pushed, code := upgrade(py, "push")
	echoed, code2 := upgrade(py, "echo")
	if code != http.StatusSwitchingProtocols || code2 != http.StatusSwitchingProtocols {
		t.Fatalf("the python server's streams: %d %d", code, code2)
	}
	opened := time.Now()
	// Used, a stream lives past the idle time; left alone, it ends.
	for i := range 3 {
		for _, ws := range []*websocket.Conn{first, echoed} {
			if err := echo(ws, fmt.Sprint("message ", i)); err != nil {
				t.Fatal(err)
			}
		}
		time.Sleep(time.Second)
	}
	if !ended(second, time.Minute) {
		t.Fatal("an idle stream lived on")
	}
	if !ended(pushed, 3*time.Second) {
		t.Errorf("an idle stream to a server that never reads lived on, %v after it opened", time.Since(opened).Round(time.Second))
	}
	t.Logf("the idle streams ended %v after they opened", time.Since(opened).Round(100*time.Millisecond))
	time.Sleep(time.Until(opened.Add(idle + time.Second)))
	if err := echo(echoed, "still here"); err != nil {
		t.Errorf("a stream in use, %v after it opened: %v", time.Since(opened).Round(time.Second), err)
	}
	// The server that pushes learns its stream ended when it next pushes:
	// nothing of the preview holds its connection.
	var states string
	for deadline, pushes := time.Now().Add(5*time.Second), 1; ; pushes++ {
		if _, states = s.browse(t, py+"push", nil); strings.Contains(states, "/push gone") {
			t.Logf("the server's push %d failed: %s", pushes, states)
			break
		}
		if time.Now().After(deadline) {
			t.Errorf("the server's pushes still go through once the stream ended: %s", states)
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	// Its place came back.
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		ws, code := upgrade(u, "echo")
		if code == http.StatusSwitchingProtocols {
			if err := echo(ws, "again"); err != nil {
				t.Error(err)
			}
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after a stream ended: %d", code)
		}
	}
}
