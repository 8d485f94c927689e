package link

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/runbox-dev/runbox"
	"github.com/runbox-dev/runbox/internal/lifecycle"
)

// Bounds of the executor's side.
const (
	// maxBody bounds a request: the files of a project (20 of 1 MB) in
	// JSON's base64.
	maxBody = 32 << 20
	// dialTimeout bounds reaching a port in a sandbox.
	dialTimeout = 10 * time.Second
	// upgrade names the protocol a dial switches to: the raw stream.
	upgrade = "runbox-stream"
)

// Server serves the link on an executor. It is a lifecycle.Service: Start
// listens, Stop closes the listener and every stream.
type Server struct {
	lifecycle.Base
	opts ServerOptions

	mu       sync.Mutex
	streams  map[net.Conn]struct{}
	stopping bool
}

// ServerOptions configure a Server.
type ServerOptions struct {
	// Listener is where it serves (Listen).
	Listener net.Listener
	Key      []byte
	Backend  Backend
	Logger   *slog.Logger
	Now      func() time.Time
}

// Listen listens on addr (EXECUTOR_LINK_ADDR) and returns the listener
// and the address to announce: advertise (EXECUTOR_LINK_ADVERTISE, host
// or host:port, the listener's port when it names none), or else the
// listener's address, with the host's first IPv4 address (or its name)
// for an unspecified host.
func Listen(addr, advertise string) (net.Listener, string, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, "", fmt.Errorf("link: listen on %s: %w", addr, err)
	}
	adv, err := advertised(advertise, ln.Addr().(*net.TCPAddr))
	if err != nil {
		ln.Close()
		return nil, "", err
	}
	return ln, adv, nil
}

// NewServer returns a Server.
func NewServer(opts ServerOptions) *Server {
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	return &Server{opts: opts, streams: map[net.Conn]struct{}{}}
}

// Start serves on the listener until ctx ends or Stop is called, which
// close it.
func (s *Server) Start(ctx context.Context) error {
	ln := s.opts.Listener
	mux := http.NewServeMux()
	mux.HandleFunc("GET /probe", s.authed(s.probe))
	mux.HandleFunc("GET /dial", s.authed(s.dial))
	mux.HandleFunc("POST /files", s.authed(s.files))
	mux.HandleFunc("GET /output", s.authed(s.output))
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 2 * time.Minute}
	return s.Base.Run(ctx, func(ctx context.Context) {
		done := make(chan struct{})
		go func() {
			defer close(done)
			if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
				s.opts.Logger.Error("link server", "err", err)
			}
		}()
		<-ctx.Done()
		_ = srv.Close()
		s.mu.Lock()
		s.stopping = true
		for c := range s.streams {
			c.Close()
		}
		s.mu.Unlock()
		<-done
	})
}

// advertised is the address to announce for a listener bound to bound.
func advertised(configured string, bound *net.TCPAddr) (string, error) {
	port := strconv.Itoa(bound.Port)
	if configured != "" {
		if _, _, err := net.SplitHostPort(configured); err == nil {
			return configured, nil
		}
		return net.JoinHostPort(configured, port), nil
	}
	if !bound.IP.IsUnspecified() {
		return bound.String(), nil
	}
	// Listening everywhere: the address of this host on its network (a
	// container's on its compose network), else its name.
	if addrs, err := net.InterfaceAddrs(); err == nil {
		for _, a := range addrs {
			if ip, ok := a.(*net.IPNet); ok && ip.IP.To4() != nil && ip.IP.IsGlobalUnicast() {
				return net.JoinHostPort(ip.IP.String(), port), nil
			}
		}
	}
	host, err := os.Hostname()
	if err != nil {
		return "", fmt.Errorf("link: the host's address, to advertise: %w", err)
	}
	return net.JoinHostPort(host, port), nil
}

// authed reads a request's body (bounded) and checks its signature.
func (s *Server) authed(h func(w http.ResponseWriter, r *http.Request, body []byte)) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBody))
		if err != nil {
			writeError(w, http.StatusRequestEntityTooLarge, runbox.ETooLarge, "request too large")
			return
		}
		if !verify(s.opts.Key, s.opts.Now(), r, body) {
			writeError(w, http.StatusUnauthorized, runbox.EUnauthorized, "bad signature")
			return
		}
		h(w, r, body)
	}
}

func target(r *http.Request) (conv string, port int, ok bool) {
	conv = r.URL.Query().Get("conv")
	port, err := strconv.Atoi(r.URL.Query().Get("port"))
	return conv, port, err == nil && runbox.ValidConversationKey(conv) && port > 0 && port < 65536
}

func (s *Server) probe(w http.ResponseWriter, r *http.Request, _ []byte) {
	conv, port, ok := target(r)
	if !ok {
		writeError(w, http.StatusBadRequest, runbox.EInvalid, "bad target")
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), dialTimeout)
	defer cancel()
	live, err := probe(ctx, s.opts.Backend, conv, port)
	if err != nil {
		s.fail(w, err)
		return
	}
	writeJSON(w, probeReply{Sandboxes: live})
}

type probeReply struct {
	Sandboxes []string `json:"sandboxes"`
}

// dial switches the connection to a raw stream to the port.
func (s *Server) dial(w http.ResponseWriter, r *http.Request, _ []byte) {
	conv, port, ok := target(r)
	if !ok || r.Header.Get("Upgrade") != upgrade {
		writeError(w, http.StatusBadRequest, runbox.EInvalid, "bad target")
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), dialTimeout)
	defer cancel()
	back, err := dial(ctx, s.opts.Backend, conv, port, r.URL.Query()["sandbox"])
	if err != nil {
		s.fail(w, err)
		return
	}
	conn, brw, err := http.NewResponseController(w).Hijack()
	if err != nil {
		back.Close()
		s.opts.Logger.Warn("link: hijack", "err", err)
		return
	}
	_ = conn.SetDeadline(time.Time{})
	if _, err := brw.WriteString("HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: " + upgrade + "\r\n\r\n"); err != nil || brw.Flush() != nil {
		conn.Close()
		back.Close()
		return
	}
	client := &bufferedConn{Conn: conn, r: brw.Reader}
	if !s.track(client, true) {
		client.Close()
		back.Close()
		return
	}
	defer s.track(client, false)
	Splice(client, back)
}

// track adds or removes a stream to close on Stop; false once stopping.
func (s *Server) track(c net.Conn, add bool) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case !add:
		delete(s.streams, c)
	case s.stopping:
		return false
	default:
		s.streams[c] = struct{}{}
	}
	return true
}

func (s *Server) files(w http.ResponseWriter, r *http.Request, body []byte) {
	conv := r.URL.Query().Get("conv")
	var files []File
	if !runbox.ValidConversationKey(conv) || json.Unmarshal(body, &files) != nil {
		writeError(w, http.StatusBadRequest, runbox.EInvalid, "bad request")
		return
	}
	if err := s.opts.Backend.WriteFiles(r.Context(), conv, files); err != nil {
		s.fail(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) output(w http.ResponseWriter, r *http.Request, _ []byte) {
	out, ok := s.opts.Backend.Output(r.URL.Query().Get("run"))
	if !ok {
		s.fail(w, ErrNoRun)
		return
	}
	writeJSON(w, out)
}

// Codes of the link's own errors on the wire.
const (
	codeGone         = "gone"
	codeNotListening = "not_listening"
	codeNoRun        = "no_run"
)

func (s *Server) fail(w http.ResponseWriter, err error) {
	switch e, ok := errors.AsType[*runbox.Error](err); {
	case errors.Is(err, ErrGone):
		writeError(w, http.StatusGone, codeGone, "gone")
	case errors.Is(err, ErrNotListening):
		writeError(w, http.StatusConflict, codeNotListening, "not listening")
	case errors.Is(err, ErrNoRun):
		writeError(w, http.StatusNotFound, codeNoRun, "no such run")
	case ok:
		writeError(w, http.StatusBadRequest, e.Code, e.Message)
	default:
		s.opts.Logger.Error("link request failed", "err", err)
		writeError(w, http.StatusInternalServerError, runbox.EInternal, "internal error")
	}
}

type wireError struct {
	Error   string `json:"error"`
	Message string `json:"message"`
}

func writeError(w http.ResponseWriter, status int, code, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(wireError{Error: code, Message: msg})
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(v)
}
