package e2b

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/runbox-dev/runbox"
	"github.com/runbox-dev/runbox/internal/agent"
	"github.com/runbox-dev/runbox/internal/audit"
)

// A sandbox's own traffic: each call names the sandbox (by header or by
// host) and carries its access token; the sandbox's client is then the
// caller, for its tier and the audit log. What a call reaches:
//
//   - the daemon (49983), by header or host: the access token, or a
//     signed /files URL (E2B's v1 signature of the access token);
//   - the code interpreter (49999), by header or host, for templates
//     that have one: the access token or the traffic token;
//   - any other port a program listens on, by host only, as E2B serves
//     them: the traffic token if the sandbox asked for private traffic.
//     The agent's own listener (the egress proxy's, 3128) is never one:
//     it would lend the sandbox's egress and secrets to whoever calls.
//
// A call by header to a port other than the daemon's and the
// interpreter's is refused: those are served on the api's host, where a
// program's pages have no business.

// Bounds of a sandbox call.
const (
	// maxCallBody bounds a call's body but an upload's (the api's upload
	// limit) and an input stream's (each message bounded by the daemon).
	maxCallBody = 16 << 20
	// readIdle bounds how long a call's body may stall between reads.
	readIdle = time.Minute
	// writeStall bounds one write of an answer to the caller.
	writeStall = 30 * time.Second
)

// proxyPort is the agent's proxy listener's port (agent.ProxyAddr).
var proxyPort = portOf(agent.ProxyAddr)

func portOf(addr string) int {
	var port int
	_, after, _ := strings.Cut(addr, ":")
	_, _ = fmt.Sscan(after, &port)
	return port
}

// serveSandbox serves a call to port of sandbox id; path is the call's
// path in the sandbox; host says it came by host (<port>-<id>.<domain>).
func (h *Handler) serveSandbox(w http.ResponseWriter, r *http.Request, id string, port int, path string, host bool) {
	route := fmt.Sprintf("E2B %d %s", port, path)
	if !host && port != envdPort && port != interpreterPort {
		writeJSON(w, http.StatusForbidden, apiError{Code: http.StatusForbidden, SandboxID: id,
			Message: fmt.Sprintf("port %d is reached by its host (<port>-<sandbox id>.<domain>), not by header", port)})
		return
	}
	var sb runbox.E2BSandbox
	var err error
	if validID(id) {
		sb, err = h.svc.store.E2BSandbox(r.Context(), id)
	} else {
		err = runbox.ErrE2BSandboxNotFound
	}
	if errors.Is(err, runbox.ErrE2BSandboxNotFound) {
		writeJSON(w, http.StatusBadGateway, apiError{Code: http.StatusBadGateway, SandboxID: clip(id, 64),
			Message: "The sandbox was not found: it was killed, or reached its end of life."})
		return
	}
	if err != nil {
		h.writeError(w, r, err)
		return
	}
	if msg := h.authorize(r, sb, port, path); msg != "" {
		h.refused(w, r, route, msg)
		return
	}
	r = r.WithContext(h.svc.asClient(r.Context(), sb.Client))
	release, ok := h.admit(w, r)
	if !ok {
		return
	}
	defer release()
	sb, ok = h.running(w, r, sb)
	if !ok {
		return
	}
	h.forward(w, r, sb, port, path, host, route)
}

// running returns sb running: a paused one resumes first when it asked
// to be (autoResume); one whose end came, or that is paused, is answered
// as E2B's proxy does (502).
func (h *Handler) running(w http.ResponseWriter, r *http.Request, sb runbox.E2BSandbox) (runbox.E2BSandbox, bool) {
	if sb.State == runbox.E2BPaused && sb.AutoResume {
		resumed, _, err := h.svc.Connect(r.Context(), sb.ID, defaultResumeTimeout)
		if err != nil {
			h.writeError(w, r, err)
			return sb, false
		}
		return resumed, true
	}
	if sb.State != runbox.E2BRunning || !h.svc.clock.Now().Before(sb.EndAt) {
		writeJSON(w, http.StatusBadGateway, apiError{Code: http.StatusBadGateway, SandboxID: sb.ID,
			Message: "The sandbox is not running: it is paused, or reached its end of life."})
		return sb, false
	}
	return sb, true
}

// defaultResumeTimeout is how long a sandbox resumed by traffic lives
// (E2B's default sandbox timeout).
const defaultResumeTimeout = 5 * time.Minute

// authorize checks a call's credential for port of sb; it returns why it
// is refused, "" when it is not.
func (h *Handler) authorize(r *http.Request, sb runbox.E2BSandbox, port int, path string) string {
	key := h.svc.key
	access := tokenIs(key, sb, accessToken, r.Header.Get(headerAccessToken))
	switch port {
	case envdPort:
		if access {
			return ""
		}
		if q := r.URL.Query(); path == "/files" && q.Get("signature") != "" {
			op := "read"
			if r.Method == http.MethodPost {
				op = "write"
			}
			if ok, why := signatureValid(key, sb, q.Get("path"), op, q.Get("username"), q.Get("signature"),
				q.Get("signature_expiration"), h.svc.clock.Now()); !ok {
				return why
			}
			return ""
		}
		return "the sandbox's access token (X-Access-Token) is required"
	case interpreterPort:
		if access || tokenIs(key, sb, trafficToken, r.Header.Get(headerTrafficToken)) {
			return ""
		}
		return "the sandbox's access token (X-Access-Token) or traffic token (E2B-Traffic-Access-Token) is required"
	}
	if sb.PrivateTraffic && !tokenIs(key, sb, trafficToken, r.Header.Get(headerTrafficToken)) {
		return "the sandbox's traffic token (E2B-Traffic-Access-Token) is required"
	}
	return ""
}

// forward records a call and sends it where it goes.
func (h *Handler) forward(w http.ResponseWriter, r *http.Request, sb runbox.E2BSandbox, port int, path string, host bool, name string) {
	if port == proxyPort {
		writeJSON(w, http.StatusForbidden, apiError{Code: http.StatusForbidden, SandboxID: sb.ID,
			Message: fmt.Sprintf("port %d is the sandbox's egress proxy, which no one outside reaches", port)})
		return
	}
	if port == interpreterPort && !sb.Interpreter {
		writeJSON(w, http.StatusBadGateway, apiError{Code: http.StatusBadGateway, SandboxID: sb.ID,
			Message: "This sandbox's template has no code interpreter (use code-interpreter-v1)."})
		return
	}
	end := func(string) {}
	if path != "/health" {
		var ok bool
		if end, ok = h.record(w, r, audit.Entry{Client: sb.Client, Route: name, Conversation: sb.ID}); !ok {
			return
		}
	}
	sw := &statusWriter{ResponseWriter: w, rc: http.NewResponseController(w)}
	// A call's body and its answer flow at once (a process's events
	// stream while its input may still come): without this the server
	// would close the body once the answer begins, and the proxy, still
	// reading it, would drop its connection to the sandbox mid-answer.
	_ = sw.rc.EnableFullDuplex()
	limit := int64(maxCallBody)
	switch {
	case path == "/files" && r.Method == http.MethodPost:
		limit = h.svc.limits.MaxUpload
	case strings.HasSuffix(path, "/StreamInput"):
		limit = -1
	}
	if limit >= 0 && r.ContentLength > limit {
		end(runbox.ETooLarge)
		writeJSON(w, http.StatusRequestEntityTooLarge, apiError{Code: http.StatusRequestEntityTooLarge, SandboxID: sb.ID,
			Message: fmt.Sprintf("the request body is larger than %d bytes", limit)})
		return
	}
	if r.Body != nil && r.Body != http.NoBody {
		r.Body = &idleBody{r: r.Body, limit: limit, rc: sw.rc, w: w}
	}
	_ = sw.rc.SetReadDeadline(time.Now().Add(readIdle))
	// Recorded however the call ends: an answer cut short (the sandbox
	// went) ends it by a panic the server expects.
	defer func() { end(outcome(sw.status)) }()
	if port == interpreterPort {
		r.URL.Path = path
		h.opts.Interpreter.Serve(sw, r, sb)
		return
	}
	h.proxy.serve(sw, r, &route{sb: sb, port: port, path: path, api: !host})
}

// outcome is an answer's status as the audit log records it.
func outcome(status int) string {
	switch {
	case status >= 500:
		return runbox.EInternal
	case status >= 400:
		return runbox.EInvalid
	}
	return ""
}

// statusWriter gives every write of an answer writeStall, and keeps its
// status for the audit log.
type statusWriter struct {
	http.ResponseWriter
	rc     *http.ResponseController
	status int
}

func (w *statusWriter) WriteHeader(code int) {
	if w.status == 0 {
		w.status = code
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(p []byte) (int, error) {
	if w.status == 0 {
		w.status = http.StatusOK
	}
	_ = w.rc.SetWriteDeadline(time.Now().Add(writeStall))
	return w.ResponseWriter.Write(p)
}

func (w *statusWriter) Flush() {
	_ = w.rc.SetWriteDeadline(time.Now().Add(writeStall))
	_ = w.rc.Flush()
}

func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// idleBody is a call's body: each read may wait readIdle for bytes (an
// upload streams for as long as it keeps coming, a stalled one ends), and
// past limit bytes (-1: none) it is cut off with 413.
type idleBody struct {
	r     io.ReadCloser
	limit int64
	n     int64
	rc    *http.ResponseController
	w     http.ResponseWriter
	once  sync.Once
}

var errBodyTooLarge = errors.New("e2b: the request body is larger than allowed")

func (b *idleBody) Read(p []byte) (int, error) {
	_ = b.rc.SetReadDeadline(time.Now().Add(readIdle))
	if b.limit >= 0 && b.n >= b.limit {
		var one [1]byte
		if n, _ := b.r.Read(one[:]); n > 0 {
			b.once.Do(func() {
				b.w.Header().Set("Connection", "close")
			})
			return 0, errBodyTooLarge
		}
		return 0, io.EOF
	}
	if b.limit >= 0 && int64(len(p)) > b.limit-b.n {
		p = p[:b.limit-b.n]
	}
	n, err := b.r.Read(p)
	b.n += int64(n)
	return n, err
}

func (b *idleBody) Close() error { return b.r.Close() }
