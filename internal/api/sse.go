package api

import (
	"crypto/rand"
	"mime"
	"net/http"
	"sync"

	mcpsdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/runbox-dev/runbox/internal/auth"
)

// sseHandler serves MCP's HTTP+SSE transport (protocol 2024-11-05): a GET
// opens an event stream, which is a session of its own, and the client
// POSTs its messages to the stream's endpoint (?sessionid=). The tools
// run with the stream's request, so as the client that opened it: a
// message is taken only with that client's token, and another client's
// valid token is refused (403) — the SDK's SSEHandler would take it for
// anyone who knows the endpoint. It is the SDK's handler otherwise,
// built on its transport.
type sseHandler struct {
	server  func() *mcpsdk.Server
	maxBody int64

	mu      sync.Mutex
	streams map[string]sseStream // by session id
}

// sseStream is an open event stream and the client that opened it.
type sseStream struct {
	transport *mcpsdk.SSEServerTransport
	client    string
}

func newSSEHandler(server func() *mcpsdk.Server, maxBody int64) *sseHandler {
	return &sseHandler{server: server, maxBody: maxBody, streams: map[string]sseStream{}}
}

func (h *sseHandler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	switch r.Method {
	case http.MethodGet:
		h.open(w, r)
	case http.MethodPost:
		h.post(w, r)
	default:
		w.Header().Set("Allow", "GET, POST")
		http.Error(w, "Method Not Allowed", http.StatusMethodNotAllowed)
	}
}

// post hands a message to the stream it names, if the caller opened it.
func (h *sseHandler) post(w http.ResponseWriter, r *http.Request) {
	if mt, _, err := mime.ParseMediaType(r.Header.Get("Content-Type")); err != nil || mt != "application/json" {
		http.Error(w, "Content-Type must be 'application/json'", http.StatusUnsupportedMediaType)
		return
	}
	id := r.URL.Query().Get("sessionid")
	if id == "" {
		http.Error(w, "sessionid must be provided", http.StatusBadRequest)
		return
	}
	h.mu.Lock()
	st, ok := h.streams[id]
	h.mu.Unlock()
	switch {
	case !ok:
		http.Error(w, "session not found", http.StatusNotFound)
	case st.client != auth.Client(r.Context()):
		http.Error(w, "this session was opened with another client's token", http.StatusForbidden)
	default:
		st.transport.ServeHTTP(w, r)
	}
}

// open serves a new session's event stream until its client goes or the
// session ends.
func (h *sseHandler) open(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	w.Header().Set("Connection", "keep-alive")
	id := rand.Text()
	endpoint, err := r.URL.Parse("?sessionid=" + id)
	if err != nil {
		http.Error(w, "internal error: failed to create endpoint", http.StatusInternalServerError)
		return
	}
	t := &mcpsdk.SSEServerTransport{Endpoint: endpoint.RequestURI(), Response: w, MaxRequestBodyBytes: h.maxBody}
	// Known before the endpoint is sent (Connect), so that the client's
	// first message finds it.
	h.mu.Lock()
	h.streams[id] = sseStream{transport: t, client: auth.Client(r.Context())}
	h.mu.Unlock()
	defer func() {
		h.mu.Lock()
		delete(h.streams, id)
		h.mu.Unlock()
	}()
	ss, err := h.server().Connect(r.Context(), t, nil)
	if err != nil {
		http.Error(w, "connection failed", http.StatusInternalServerError)
		return
	}
	defer ss.Close()
	ended := make(chan struct{})
	go func() {
		_ = ss.Wait()
		close(ended)
	}()
	select {
	case <-r.Context().Done():
	case <-ended:
	}
}
