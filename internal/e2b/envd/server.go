// Package envd is runbox's E2B sandbox daemon: it runs inside an E2B
// sandbox (a runbox conversation's sandbox, started as its background
// program by internal/e2b) and serves what E2B's SDKs ask of a sandbox —
// the process and filesystem services (Connect-RPC, internal/e2b/envdpb)
// and the /files and /health routes — on the sandbox's loopback. The api
// reaches it through the executor's link after checking the caller's
// token; nothing else outside the sandbox can.
//
// envd runs as the sandbox's one user, with no capabilities: what it
// does a program of the sandbox could do. So a process it starts is the
// user's, a path it opens resolves inside the sandbox, and a user other
// than "user" (root, say) is refused rather than faked.
package envd

import (
	"encoding/base64"
	"errors"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"time"

	"connectrpc.com/connect"

	"github.com/runbox-dev/runbox/internal/e2b/envdpb/filesystem/filesystempbconnect"
	"github.com/runbox-dev/runbox/internal/e2b/envdpb/process/processpbconnect"
)

// Version is the envd version the daemon implements, as E2B numbers it:
// the SDKs switch features on it (stdin, the default user, closing stdin,
// streamed uploads, file metadata, entries in watch events, watching
// network mounts).
const Version = "0.6.4"

// Errors of requests.
var (
	errPathNUL  = errors.New("the path holds a NUL byte")
	errPathLong = errors.New("the path is longer than 4096 bytes")
	errRoot     = errors.New("runbox runs nothing as root; the sandbox's user is \"user\"")
	errUser     = errors.New("unknown user; the sandbox's user is \"user\"")
)

// Config says how the daemon serves.
type Config struct {
	// Home is the user's home as clients name it (/home/user); Data is
	// where it leads (/data): see paths.
	Home, Data string
	// User is the sandbox's user's name ("user"), the only one a request
	// may name.
	User string
	// Env is the environment processes start with, before a request's
	// own (the daemon's, with HOME and USER set).
	Env []string
	// Limits bound what clients may hold: processes, watchers, output.
	Limits Limits
	Logger *slog.Logger
}

// Limits bound what the daemon holds for its clients.
type Limits struct {
	// Processes bounds the processes the daemon started that still run.
	Processes int
	// Watchers bounds the folder watchers open at once (streams and the
	// watcher trio's), and WatcherEvents the events one collects between
	// two reads of them.
	Watchers, WatcherEvents int
	// Stall is how long a process's output waits for a client that does
	// not read it before that client's stream is cut: output is never
	// held beyond a few chunks per client.
	Stall time.Duration
}

// DefaultLimits are the limits a zero Limits stands for.
var DefaultLimits = Limits{Processes: 256, Watchers: 64, WatcherEvents: 10000, Stall: 30 * time.Second}

// maxMessage bounds a request message of the services (input sent to a
// process, a command and its environment).
const maxMessage = 8 << 20

// Server is the daemon: an http.Handler.
type Server struct {
	cfg   Config
	paths paths
	names names
	procs *processes
	watch *watchers
	cpu   cpuSample // the last CPU reading (metrics)
	log   *slog.Logger
	mux   *http.ServeMux
}

// New returns the daemon. Close ends what it started.
func New(cfg Config) *Server {
	if cfg.Limits == (Limits{}) {
		cfg.Limits = DefaultLimits
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	s := &Server{cfg: cfg, paths: paths{home: cfg.Home, data: cfg.Data}, log: cfg.Logger}
	s.procs = newProcesses(s)
	s.watch = newWatchers(s)
	mux := http.NewServeMux()
	limit := connect.WithReadMaxBytes(maxMessage)
	mux.Handle(processpbconnect.NewProcessHandler(&processService{s}, limit))
	mux.Handle(filesystempbconnect.NewFilesystemHandler(&filesystemService{s}, limit))
	mux.HandleFunc("GET /health", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusNoContent) })
	mux.HandleFunc("GET /files", s.download)
	mux.HandleFunc("POST /files", s.upload)
	mux.HandleFunc("GET /metrics", s.metrics)
	s.mux = mux
	return s
}

func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) { s.mux.ServeHTTP(w, r) }

// Close kills the processes the daemon started and ends its watchers.
func (s *Server) Close() {
	s.procs.closeAll()
	s.watch.closeAll()
}

// checkUser accepts a request made as the sandbox's user: the user its
// Authorization header names (Basic, "user:"), or none.
func (s *Server) checkUser(h http.Header) error {
	return s.checkName(basicUser(h.Get("Authorization")))
}

// checkName accepts the sandbox's user's name, or none.
func (s *Server) checkName(name string) error {
	switch name {
	case "", s.cfg.User:
		return nil
	case "root":
		return connect.NewError(connect.CodePermissionDenied, errRoot)
	}
	return connect.NewError(connect.CodeInvalidArgument, errUser)
}

// basicUser returns the user name of HTTP Basic credentials, "" for none.
func basicUser(auth string) string {
	enc, ok := strings.CutPrefix(auth, "Basic ")
	if !ok {
		return ""
	}
	b, err := base64.StdEncoding.DecodeString(strings.TrimSpace(enc))
	if err != nil {
		return "\x00" // not a user anyone is
	}
	name, _, _ := strings.Cut(string(b), ":")
	return name
}

// keepaliveHeader is where a client says how often a stream should carry
// a keepalive (seconds).
const keepaliveHeader = "Keepalive-Ping-Interval"

// keepalive is how often a stream carries a keepalive: what the client
// asked, within bounds, else every 30 s.
func keepalive(h http.Header) time.Duration {
	if n, err := strconv.Atoi(h.Get(keepaliveHeader)); err == nil && n > 0 {
		return time.Duration(min(n, 300)) * time.Second
	}
	return 30 * time.Second
}
