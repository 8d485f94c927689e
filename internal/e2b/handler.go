// Package e2b makes runbox a drop-in E2B server: E2B's SDKs, pointed at
// <base>/e2b (E2B_API_URL and E2B_SANDBOX_URL), work unchanged. An E2B
// sandbox is a runbox conversation of the caller's client — its id the
// sandbox's — with runbox's E2B daemon (internal/e2b/envd) as its
// background run; every runbox rule (tenants, tiers, quotas, audit,
// egress, secrets, containment) holds as for any run.
//
// Handler serves the control plane (E2B's REST API: create, list, get,
// kill, pause, connect, timeouts, metrics; a runbox token as X-API-KEY)
// and the sandboxes' own traffic, routed by the E2b-Sandbox-Id and
// E2b-Sandbox-Port headers or by <port>-<id>.<domain> hosts: to the
// daemon (port 49983) through the executor's link, to the code
// interpreter (49999, internal/e2b/interp), and, by host, to the ports
// the sandbox's programs listen on. Each sandbox call carries the
// sandbox's own access token.
package e2b

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"github.com/runbox-dev/runbox"
	"github.com/runbox-dev/runbox/internal/audit"
	"github.com/runbox-dev/runbox/internal/auth"
	"github.com/runbox-dev/runbox/internal/clients"
)

// Prefix is where the api serves E2B's API.
const Prefix = "/e2b"

// Headers E2B's SDKs route and authorise sandbox calls with.
const (
	headerSandboxID    = "E2b-Sandbox-Id"
	headerSandboxPort  = "E2b-Sandbox-Port"
	headerAccessToken  = "X-Access-Token"
	headerTrafficToken = "E2B-Traffic-Access-Token"
	headerAPIKey       = "X-Api-Key"
)

// Interpreter serves a sandbox's code interpreter (port 49999); the
// request's context carries the sandbox's client.
type Interpreter interface {
	Serve(w http.ResponseWriter, r *http.Request, sb runbox.E2BSandbox)
}

// Auditor records calls (*audit.Recorder).
type Auditor interface {
	Begin(ctx context.Context, e audit.Entry) (*audit.Call, error)
}

// Refusals count the requests refused for their token per source
// address (*refusals.Limiter): past its budget, a source is answered
// 429 at once.
type Refusals interface {
	Refuse(ctx context.Context, addr netip.Addr, route string) time.Duration
}

// HandlerOptions are what the Handler serves with.
type HandlerOptions struct {
	Tokens      *auth.Tokens
	Interpreter Interpreter
	Audit       Auditor  // nil: nothing recorded
	Refusals    Refusals // nil: none counted
	// Source returns a request's source address (the api's: trusted
	// proxies' X-Forwarded-For).
	Source func(*http.Request) netip.Addr
	// Resources are what each sandbox is given, as E2B reports them.
	Resources Resources
	// InFlight counts each client's requests in flight, the api's with
	// them (concurrent_requests); nil: 64 each, counted apart.
	InFlight *clients.InFlight
}

// Resources are a sandbox's CPU, memory and disk, as listings say.
type Resources struct {
	CPUs                 int
	MemoryMB, DiskSizeMB int64
}

// Handler is the HTTP face of E2B's API.
type Handler struct {
	svc     *Service
	opts    HandlerOptions
	control *http.ServeMux
	proxy   *proxy
	log     *slog.Logger
}

// NewHandler returns the Handler of svc's sandboxes.
func NewHandler(svc *Service, o HandlerOptions) *Handler {
	if o.InFlight == nil {
		o.InFlight = clients.NewInFlight(64)
	}
	if o.Source == nil {
		o.Source = func(r *http.Request) netip.Addr {
			ap, _ := netip.ParseAddrPort(r.RemoteAddr)
			return ap.Addr()
		}
	}
	h := &Handler{svc: svc, opts: o, log: svc.log}
	h.proxy = newProxy(svc)
	h.control = h.routes()
	return h
}

// ServeHTTP serves a request under Prefix: a sandbox's call when it
// names one (E2b-Sandbox-Id), else the control plane's.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if id := r.Header.Get(headerSandboxID); id != "" {
		port, err := strconv.Atoi(r.Header.Get(headerSandboxPort))
		if err != nil {
			port = envdPort
		}
		h.serveSandbox(w, r, id, port, strings.TrimPrefix(r.URL.Path, Prefix), false)
		return
	}
	h.control.ServeHTTP(w, r)
}

// ServeHost serves a request whose host is a preview host labelled
// <port>-<sandbox id>; false, serving nothing, when the label is not one.
func (h *Handler) ServeHost(w http.ResponseWriter, r *http.Request, label string) bool {
	p, id, ok := strings.Cut(label, "-")
	port, err := strconv.Atoi(p)
	if !ok || err != nil || port < 1 || port > 65535 || !validID(id) {
		return false
	}
	h.serveSandbox(w, r, id, port, r.URL.Path, true)
	return true
}

// apiError is every error's answer, as E2B's API words it.
type apiError struct {
	Code      int    `json:"code"`
	Message   string `json:"message"`
	SandboxID string `json:"sandboxId,omitempty"`
}

// statuses map runbox's error codes to HTTP statuses.
var statuses = map[string]int{
	runbox.EInvalid:            http.StatusBadRequest,
	runbox.EUnknownLanguage:    http.StatusBadRequest,
	runbox.EUnsupported:        http.StatusBadRequest,
	runbox.ENotFound:           http.StatusNotFound,
	runbox.EConversationExists: http.StatusConflict,
	runbox.ETooLarge:           http.StatusRequestEntityTooLarge,
	runbox.EQuotaExceeded:      http.StatusTooManyRequests,
	runbox.EBusy:               http.StatusTooManyRequests,
	runbox.ERateLimited:        http.StatusTooManyRequests,
	runbox.EMaxSessions:        http.StatusTooManyRequests,
	runbox.EUnauthorized:       http.StatusUnauthorized,
	runbox.EEgressDenied:       http.StatusForbidden,
	runbox.EForbidden:          http.StatusForbidden,
	runbox.EUnavailable:        http.StatusServiceUnavailable,
}

// writeError answers err; an unexpected one is logged and not told.
func (h *Handler) writeError(w http.ResponseWriter, r *http.Request, err error) {
	code := runbox.ErrorCode(err)
	status, ok := statuses[code]
	msg := runbox.ErrorMessage(err)
	if !ok {
		status, msg = http.StatusInternalServerError, "internal error"
		h.log.Error("e2b request failed", "method", r.Method, "path", r.URL.Path, "err", err)
	}
	if secs := runbox.RetryAfterSeconds(err); secs > 0 {
		w.Header().Set("Retry-After", strconv.Itoa(secs))
	}
	writeJSON(w, status, apiError{Code: status, Message: msg})
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// authenticate returns the request with its client, from a runbox token
// in X-API-KEY or Authorization: Bearer; false, answered, when it has
// none valid.
func (h *Handler) authenticate(w http.ResponseWriter, r *http.Request, route string) (*http.Request, bool) {
	key := r.Header.Get(headerAPIKey)
	if key == "" {
		key, _ = strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	}
	c, ok := h.opts.Tokens.Check(strings.TrimSpace(key))
	if !ok {
		h.refused(w, r, route, "a valid API key (a runbox token) is required in X-API-KEY")
		return nil, false
	}
	return r.WithContext(auth.WithClient(r.Context(), c)), true
}

// admit takes a place among the client's requests in flight and counts
// the call against its tier's calls_per_minute; false, answered, when it
// is past either (a stream of a process or a watch holds its place while
// it lasts).
func (h *Handler) admit(w http.ResponseWriter, r *http.Request) (func(), bool) {
	c, _ := h.svc.clients(auth.Client(r.Context()))
	release, ok := h.opts.InFlight.Acquire(auth.Client(r.Context()), auth.Tier(r.Context()))
	if !ok {
		w.Header().Set("Retry-After", "1")
		writeJSON(w, http.StatusTooManyRequests, apiError{Code: http.StatusTooManyRequests,
			Message: fmt.Sprintf("too many requests in flight for this client%s; retry when one has finished", tierNote(c))})
		return nil, false
	}
	if err := h.svc.runs.AllowCall(r.Context()); err != nil {
		release()
		h.writeError(w, r, err)
		return nil, false
	}
	return release, true
}

func tierNote(c clients.Client) string {
	if n := c.Tier.ConcurrentRequests; n > 0 {
		return fmt.Sprintf(" (its tier's concurrent_requests, %d)", n)
	}
	return ""
}

// refused answers a request without a valid credential, counting it
// against its source.
func (h *Handler) refused(w http.ResponseWriter, r *http.Request, route, msg string) {
	if h.opts.Refusals != nil {
		if wait := h.opts.Refusals.Refuse(r.Context(), h.opts.Source(r), route); wait > 0 {
			h.writeError(w, r, runbox.Limited(runbox.ERateLimited, wait,
				"too many requests without a valid credential from this address; try again later"))
			return
		}
	}
	writeJSON(w, http.StatusUnauthorized, apiError{Code: http.StatusUnauthorized, Message: msg})
}

// record writes a call's start to the audit log and returns what writes
// its end; a call whose start cannot be written does not go on (false,
// answered).
func (h *Handler) record(w http.ResponseWriter, r *http.Request, e audit.Entry) (func(code string), bool) {
	if h.opts.Audit == nil {
		return func(string) {}, true
	}
	call, err := h.opts.Audit.Begin(r.Context(), e)
	if err != nil {
		h.writeError(w, r, err)
		return nil, false
	}
	return func(code string) { call.End(context.WithoutCancel(r.Context()), code, "") }, true
}

// errorCode is err's code as the audit log records it ("" for none).
func errorCode(err error) string {
	if err == nil {
		return ""
	}
	if errors.Is(err, runbox.ErrE2BSandboxNotFound) {
		return runbox.ENotFound
	}
	return runbox.ErrorCode(err)
}
