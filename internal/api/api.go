// Package api is the HTTP face of the service, on Echo: MCP over Streamable
// HTTP and HTTP+SSE, the REST API, signed file downloads, the playground
// page, the queue dashboard, metrics and health checks.
package api

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"embed"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"github.com/labstack/echo/v4"
	"github.com/labstack/echo/v4/middleware"
	mcpsdk "github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/runbox-dev/runbox"
	"github.com/runbox-dev/runbox/internal/audit"
	"github.com/runbox-dev/runbox/internal/auth"
	"github.com/runbox-dev/runbox/internal/clients"
	"github.com/runbox-dev/runbox/internal/conversations"
	"github.com/runbox-dev/runbox/internal/files"
	"github.com/runbox-dev/runbox/internal/mcp"
	"github.com/runbox-dev/runbox/internal/preview"
	"github.com/runbox-dev/runbox/internal/refusals"
	"github.com/runbox-dev/runbox/internal/runs"
	"github.com/runbox-dev/runbox/internal/sessions"
)

//go:embed playground.html
var static embed.FS

// Check is a readiness check: nil when the dependency answers.
type Check func(ctx context.Context) error

// Options are what the HTTP server serves.
type Options struct {
	Tokens *auth.Tokens
	Runs   *runs.Service
	Convs  *conversations.Service
	MCP    *mcp.Server
	Files  runbox.FileStore
	Signer *files.Signer
	// Dashboard serves the queues' dashboard under /monitoring
	// (queue.Dashboard); QueueMetrics reports the run queue's depth
	// (queue.NewCollector). Both read through the process's connection,
	// which the caller closes.
	Dashboard    http.Handler
	QueueMetrics prometheus.Collector
	// Ready are the readiness checks, by name.
	Ready map[string]Check
	// MaxBody bounds an MCP message (the upload tool's base64 included);
	// MaxUpload a REST upload.
	MaxBody   int64
	MaxUpload int64
	// BodyBudget bounds the bytes of the request bodies held in memory at
	// once, across every client.
	BodyBudget int64
	// Origins are the web origins besides none whose requests the api's
	// routes accept (origin.go): the server's own and MCP_ALLOWED_ORIGINS.
	Origins []string
	// MetricsToken, when set, is the bearer token /metrics asks for.
	MetricsToken string
	// Audit, when set, records every REST request.
	Audit *audit.Recorder
	// Refusals, when set, counts the requests refused for their token
	// per source address, answers 429 to a source past its budget and
	// records them in the audit log, a bounded number per source.
	Refusals *refusals.Limiter
	// TrustedProxies are the peers whose X-Forwarded-For names a request's
	// source (MCP_TRUSTED_PROXIES); none: the peer is the source.
	TrustedProxies []netip.Prefix
	Registry       *prometheus.Registry
	Logger         *slog.Logger
	// Previews issues preview URLs; PreviewRouter serves every request
	// whose Host is a preview host, and nothing else does.
	Previews      *preview.Service
	PreviewRouter *preview.Router
	// Sessions keeps the MCP sessions of Streamable HTTP (session.go);
	// nil: every call is sessionless.
	Sessions *sessions.Service
	// Webhooks answers for the deliveries of runs' and batches' webhooks;
	// nil: not served.
	Webhooks Webhooks
	// InFlight counts each client's requests in flight (concurrent_requests),
	// with the E2B API's; nil: a count of the api's own.
	InFlight *clients.InFlight
	// E2B serves E2B's API under /e2b and E2B sandboxes' hosts on the
	// preview domain (internal/e2b); nil: not served.
	E2B E2B
}

// E2B is runbox's E2B-compatible API (internal/e2b): it authenticates its
// own requests (a runbox token as E2B's API key, a sandbox's own token).
type E2B interface {
	// ServeHTTP serves a request under /e2b.
	http.Handler
	// ServeHost serves a request whose Host is a preview host labelled
	// <port>-<sandbox id>, and reports whether the label is one.
	ServeHost(w http.ResponseWriter, r *http.Request, label string) bool
}

// E2BPrefix is where the E2B-compatible API is served.
const E2BPrefix = "/e2b"

// Server handles the service's HTTP requests.
type Server struct {
	opts       Options
	log        *slog.Logger
	echo       *echo.Echo
	handler    http.Handler // echo behind the body gate
	e2b        http.Handler // the E2B API behind the origin check; nil if not served
	prometheus http.Handler
	// doc is the OpenAPI document of the routes, served as /openapi.json
	// and /reference.
	doc *document
	// closing ends long-lived streams when the server shuts down.
	closing context.Context
	close   context.CancelFunc
}

// New builds the server and its routes.
func New(opts Options) *Server {
	closing, closeFn := context.WithCancel(context.Background())
	s := &Server{opts: opts, log: opts.Logger.With("component", "http"), closing: closing, close: closeFn}
	e := echo.New()
	e.HideBanner, e.HidePort = true, true
	e.HTTPErrorHandler = s.handleError
	e.IPExtractor = ipExtractor(opts.TrustedProxies)
	e.Use(middleware.Recover(), s.logRequests, requestCounter(opts.Registry))
	opts.Registry.MustRegister(opts.QueueMetrics)

	authed := e.Group("", s.requireToken(false), newRequestCap(opts.InFlight).middleware)
	// Bearer tokens guard the MCP endpoints, so the SDK's DNS-rebinding
	// check (which also rejects reverse proxies on loopback) is not needed.
	streamable := mcpsdk.NewStreamableHTTPHandler(func(*http.Request) *mcpsdk.Server { return opts.MCP.SDK() },
		&mcpsdk.StreamableHTTPOptions{Stateless: true, DisableLocalhostProtection: true, MaxRequestBodyBytes: opts.MaxBody})
	sse := newSSEHandler(opts.MCP.SDK, opts.MaxBody)
	authed.Any("/mcp", echo.WrapHandler(withCaller(s.withSessions(streamable))))
	authed.Any("/mcp/events", echo.WrapHandler(s.closeOnShutdown(sse)))

	v1 := authed.Group("/v1", s.recordRequests, s.countCalls)
	s.prometheus = promhttp.HandlerFor(opts.Registry, promhttp.HandlerOpts{})
	routes := s.routes()
	for _, r := range routes {
		switch r.access {
		case public:
			e.Add(r.method, r.echoPath(), r.handler)
		case metricsBearer:
			e.Add(r.method, r.echoPath(), r.handler, s.metricsToken)
		case bearer:
			// Every route a token opens is under /v1 (routes_test.go).
			v1.Add(r.method, strings.TrimPrefix(r.echoPath(), "/v1"), r.handler)
		}
	}
	s.doc = mustDocument(routes)

	// The dashboard shows every client's queue: it is the operators', whose
	// token is MCP_API_TOKEN (the client "default").
	mon := e.Group("/monitoring", s.requireToken(true), operatorOnly)
	dashboard := echo.WrapHandler(quietErrors(opts.Dashboard))
	mon.Any("", dashboard)
	mon.Any("/*", dashboard)
	s.echo = e
	// The origin first: a browser's request from a page elsewhere is
	// refused before its token is looked at or its body read.
	guard := newOriginGuard(opts.Origins, apiRoute)
	s.handler = guard.wrap(newBodyGate(opts.BodyBudget, routeLimit(opts.MaxBody, opts.MaxUpload)).wrap(e))
	if opts.E2B != nil {
		// E2B's calls stream both ways and bound their own bodies: they
		// pass the origin check only.
		s.e2b = guard.wrap(opts.E2B)
	}
	return s
}

// ServeHTTP serves a request. One whose Host names a preview goes to the
// preview router and nowhere else: preview pages are hostile HTML on
// origins of their own, and never reach the api, MCP, the playground,
// downloads or the dashboard; the api's host never serves a preview.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if s.opts.Previews != nil {
		if label, ok := s.opts.Previews.Domain().Match(r.Host); ok {
			// An E2B sandbox's port (<port>-<id>) is one of the preview
			// hosts: a page on an origin of its own, as a preview.
			if s.opts.E2B != nil && s.opts.E2B.ServeHost(w, r, label) {
				return
			}
			s.opts.PreviewRouter.Serve(w, r, label)
			return
		}
	}
	if s.e2b != nil && (r.URL.Path == E2BPrefix || strings.HasPrefix(r.URL.Path, E2BPrefix+"/")) {
		s.e2b.ServeHTTP(w, r)
		return
	}
	s.handler.ServeHTTP(w, r)
}

// Close ends open event streams (SSE), so that http.Server.Shutdown need
// not wait for them. The dashboard and the queue metrics hold no
// connection of their own (they share the process's): nothing to close.
func (s *Server) Close() error {
	s.close()
	return nil
}

// withCaller lets the tools see their caller go: the MCP SDK runs a
// stateless call on a context that outlives the HTTP request.
func withCaller(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h.ServeHTTP(w, r.WithContext(mcp.WithCaller(r.Context())))
	})
}

// closeOnShutdown cancels a handler's request when the server closes.
func (s *Server) closeOnShutdown(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithCancel(r.Context())
		defer cancel()
		stop := context.AfterFunc(s.closing, cancel)
		defer stop()
		h.ServeHTTP(w, r.WithContext(ctx))
	})
}

// requireToken accepts "Authorization: Bearer <token>"; with basic, also
// HTTP Basic with the token as password, so that a browser can log in to
// the dashboard.
func (s *Server) requireToken(basic bool) echo.MiddlewareFunc {
	return func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) error {
			r := c.Request()
			token, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
			if !ok && basic {
				_, token, _ = r.BasicAuth()
			}
			client, valid := s.opts.Tokens.Check(strings.TrimSpace(token))
			if !valid {
				if basic {
					c.Response().Header().Set("WWW-Authenticate", `Basic realm="runbox"`)
				} else {
					c.Response().Header().Set("WWW-Authenticate", `Bearer realm="runbox"`)
				}
				if s.opts.Refusals != nil {
					addr, _ := netip.ParseAddr(c.RealIP())
					if wait := s.opts.Refusals.Refuse(r.Context(), addr, r.Method+" "+c.Path()); wait > 0 {
						return runbox.Limited(runbox.ERateLimited, wait,
							"too many requests without a valid API token from this address; try again later")
					}
				}
				return runbox.Errorf(runbox.EUnauthorized, "a valid API token is required")
			}
			c.SetRequest(r.WithContext(auth.WithClient(r.Context(), client)))
			c.Set("client", client.Name)
			return next(c)
		}
	}
}

// SourceAddr returns how the api reads a request's source address: the
// peer, or from a trusted proxy the nearest address in X-Forwarded-For
// that is not one (as ipExtractor).
func SourceAddr(trusted []netip.Prefix) func(*http.Request) netip.Addr {
	ex := ipExtractor(trusted)
	return func(r *http.Request) netip.Addr {
		a, _ := netip.ParseAddr(ex(r))
		return a
	}
}

// ipExtractor reads a request's source: the peer, or, from a trusted
// proxy, the nearest address in X-Forwarded-For that is not one.
// Echo's own defaults trust loopback and private peers; here only the
// ranges given are.
func ipExtractor(trusted []netip.Prefix) echo.IPExtractor {
	if len(trusted) == 0 {
		return echo.ExtractIPDirect()
	}
	opts := []echo.TrustOption{echo.TrustLoopback(false), echo.TrustLinkLocal(false), echo.TrustPrivateNet(false)}
	for _, p := range trusted {
		_, n, err := net.ParseCIDR(p.Masked().String())
		if err == nil {
			opts = append(opts, echo.TrustIPRange(n))
		}
	}
	return echo.ExtractIPFromXFFHeader(opts...)
}

// operatorOnly lets only the client "default" through.
func operatorOnly(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		if auth.Client(c.Request().Context()) != runbox.DefaultClient {
			return runbox.Errorf(runbox.ENotFound, "not found")
		}
		return next(c)
	}
}

// quietErrors keeps the text of a handler's server errors (the dashboard
// writes Redis's) from the client: a 5xx answer says only that it failed.
func quietErrors(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h.ServeHTTP(&quietWriter{ResponseWriter: w}, r)
	})
}

type quietWriter struct {
	http.ResponseWriter
	failed bool
}

func (w *quietWriter) WriteHeader(code int) {
	if code >= 500 {
		w.failed = true
		w.Header().Del("Content-Length")
		w.Header().Set("Content-Type", "application/json")
		w.ResponseWriter.WriteHeader(code)
		_, _ = w.ResponseWriter.Write([]byte(`{"error":"unavailable","message":"the queue cannot be read right now"}`))
		return
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *quietWriter) Write(p []byte) (int, error) {
	if w.failed {
		return len(p), nil
	}
	return w.ResponseWriter.Write(p)
}

func (w *quietWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// metricsToken guards /metrics with METRICS_TOKEN, when set: the
// per-client counters name the clients.
func (s *Server) metricsToken(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		if s.opts.MetricsToken == "" {
			return next(c)
		}
		got, _ := strings.CutPrefix(c.Request().Header.Get("Authorization"), "Bearer ")
		a, b := sha256.Sum256([]byte(got)), sha256.Sum256([]byte(s.opts.MetricsToken))
		if subtle.ConstantTimeCompare(a[:], b[:]) != 1 {
			c.Response().Header().Set("WWW-Authenticate", `Bearer realm="runbox-metrics"`)
			return runbox.Errorf(runbox.EUnauthorized, "a valid metrics token is required")
		}
		return next(c)
	}
}

// auditRunID is where a handler leaves the id of the run it made.
const auditRunID = "audit.run_id"

// recordRequests writes every REST request to the audit log: its start
// before it runs (one whose start cannot be written does not run), its
// end with the outcome. Bodies are not recorded, only their size.
func (s *Server) recordRequests(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		if s.opts.Audit == nil {
			return next(c)
		}
		r := c.Request()
		params := map[string]any{}
		for k, v := range r.URL.Query() {
			params[k] = strings.Join(v, ",")
		}
		if r.ContentLength > 0 {
			params["body_len"] = float64(r.ContentLength)
		}
		call, err := s.opts.Audit.Begin(r.Context(), audit.Entry{
			Client: auth.Client(r.Context()), Route: r.Method + " " + c.Path(),
			Conversation: c.Param("cid"), RunID: c.Param("id"), Params: audit.Sanitize(params),
		})
		if err != nil {
			return err
		}
		err = next(c)
		code := ""
		switch {
		case err != nil:
			code = runbox.ErrorCode(err)
			if he, ok := err.(*echo.HTTPError); ok && he.Code == http.StatusNotFound {
				code = runbox.ENotFound
			}
		case c.Response().Status >= 400:
			code = runbox.EInternal
		}
		runID, _ := c.Get(auditRunID).(string)
		call.End(r.Context(), code, runID)
		return err
	}
}

// countCalls holds REST requests to the client's calls_per_minute.
func (s *Server) countCalls(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		if err := s.opts.Runs.AllowCall(c.Request().Context()); err != nil {
			return err
		}
		return next(c)
	}
}

func (s *Server) health(c echo.Context) error {
	return c.JSON(http.StatusOK, statusReply{Status: "ok"})
}

// readiness is the answer of /readyz: "ok" or "unavailable" for each
// dependency, by name.
type readiness map[string]string

func (s *Server) ready(c echo.Context) error {
	ctx, cancel := context.WithTimeout(c.Request().Context(), 3*time.Second)
	defer cancel()
	status, code := readiness{}, http.StatusOK
	for name, check := range s.opts.Ready {
		if err := check(ctx); err != nil {
			status[name] = "unavailable"
			code = http.StatusServiceUnavailable
			s.log.Warn("readiness", "check", name, "err", err)
		} else {
			status[name] = "ok"
		}
	}
	return c.JSON(code, status)
}

func (s *Server) serveMetrics(c echo.Context) error {
	s.prometheus.ServeHTTP(c.Response(), c.Request())
	return nil
}

func (s *Server) playground(c echo.Context) error {
	b, err := static.ReadFile("playground.html")
	if err != nil {
		return err
	}
	return c.HTMLBlob(http.StatusOK, b)
}

// status maps error codes to HTTP statuses.
var status = map[string]int{
	runbox.EInvalid:          http.StatusBadRequest,
	runbox.EUnknownLanguage:  http.StatusBadRequest,
	runbox.EInvalidPath:      http.StatusBadRequest,
	runbox.ENotFound:         http.StatusNotFound,
	runbox.ESessionNotFound:  http.StatusNotFound,
	runbox.EFileExists:       http.StatusConflict,
	runbox.ETooLarge:         http.StatusRequestEntityTooLarge,
	runbox.EArtifactTooLarge: http.StatusRequestEntityTooLarge,
	runbox.EQuotaExceeded:    http.StatusInsufficientStorage,
	runbox.EBusy:             http.StatusTooManyRequests,
	runbox.ERateLimited:      http.StatusTooManyRequests,
	runbox.EUnavailable:      http.StatusServiceUnavailable,
	runbox.ENotListening:     http.StatusConflict,
	runbox.EUnauthorized:     http.StatusUnauthorized,
	runbox.EEgressDenied:     http.StatusForbidden,
	runbox.EForbidden:        http.StatusForbidden,
	runbox.EUnsupported:      http.StatusBadRequest,
	runbox.EMaxSessions:      http.StatusTooManyRequests,
	runbox.EInternal:         http.StatusInternalServerError,

	runbox.EConversationExists: http.StatusConflict,
}

// errorReply is every error's answer.
type errorReply struct {
	Error             string `json:"error" jsonschema:"what went wrong, as a code (each response says the codes of its status)"`
	Message           string `json:"message" jsonschema:"one sentence for a person"`
	RetryAfterSeconds int    `json:"retry_after_seconds,omitempty" jsonschema:"a client past a limit of its tier: when to try again (also the Retry-After header)"`
}

// handleError writes every error as {error, message}. Unexpected errors are
// logged and reported without detail.
func (s *Server) handleError(err error, c echo.Context) {
	if c.Response().Committed {
		return
	}
	code, msg := runbox.ErrorCode(err), runbox.ErrorMessage(err)
	httpStatus := status[code]
	var he *echo.HTTPError
	if errors.As(err, &he) {
		httpStatus = he.Code
		code = http.StatusText(he.Code)
		if m, ok := he.Message.(string); ok {
			msg = m
		}
		switch he.Code {
		case http.StatusNotFound:
			code = runbox.ENotFound
		case http.StatusMethodNotAllowed:
			code = "method_not_allowed"
		case http.StatusRequestEntityTooLarge:
			code = runbox.ETooLarge
		default:
			code = strings.ToLower(strings.ReplaceAll(code, " ", "_"))
		}
	} else if code == runbox.EInternal {
		s.log.Error("request failed", "method", c.Request().Method, "path", c.Request().URL.Path, "err", err)
	}
	body := errorReply{Error: code, Message: msg}
	if secs := runbox.RetryAfterSeconds(err); secs > 0 {
		// A client past a limit of its tier: 429, whichever limit.
		httpStatus = http.StatusTooManyRequests
		c.Response().Header().Set("Retry-After", strconv.Itoa(secs))
		body.RetryAfterSeconds = secs
	}
	if c.Request().Method == http.MethodHead {
		_ = c.NoContent(httpStatus)
		return
	}
	_ = c.JSON(httpStatus, body)
}

func (s *Server) logRequests(next echo.HandlerFunc) echo.HandlerFunc {
	return func(c echo.Context) error {
		start := time.Now()
		err := next(c)
		if err != nil {
			c.Error(err)
		}
		r := c.Request()
		level := slog.LevelDebug
		if c.Response().Status >= 500 {
			level = slog.LevelWarn
		}
		// The query is left out: it holds download signatures.
		s.log.Log(r.Context(), level, "request", "method", r.Method, "path", r.URL.Path,
			"status", c.Response().Status, "duration_ms", time.Since(start).Milliseconds(), "client", c.Get("client"))
		return nil
	}
}
