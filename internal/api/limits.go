package api

import (
	"context"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/labstack/echo/v4"
	"golang.org/x/sync/semaphore"

	"github.com/runbox-dev/runbox"
	"github.com/runbox-dev/runbox/internal/auth"
	"github.com/runbox-dev/runbox/internal/clients"
	"github.com/runbox-dev/runbox/internal/runs"
)

// Timeouts of the HTTP server. A request's head and body must arrive
// within ReadTimeout; after that the connection may stay open as long as
// its handler streams (an MCP call waiting for a run, an event stream),
// but no single write may stall for longer than WriteStall, so a client
// that stops reading cannot hold a handler.
const (
	ReadHeaderTimeout = 10 * time.Second
	ReadTimeout       = 2 * time.Minute
	IdleTimeout       = 2 * time.Minute
	WriteStall        = 30 * time.Second
)

// DefaultMaxRequestsPerClient bounds the requests one client has in
// flight at once.
const DefaultMaxRequestsPerClient = 64

// budgetWait is how long a request waits for room in the body budget
// before it is turned away as busy.
const budgetWait = 5 * time.Second

// bodyGate keeps what request bodies cost the api within bounds. A body
// larger than its route allows is refused from its Content-Length before
// a byte of it is read; one that declares no length is cut off where the
// limit is reached. The bodies the server holds in memory while it
// handles them (MCP messages, JSON requests) share one budget: a request
// reserves its declared length (or the route's limit, if it declares none,
// and gives back the rest once it has been read) and waits for room.
// Uploads stream to disk and reserve nothing.
type bodyGate struct {
	budget *semaphore.Weighted
	size   int64
	// limit returns the largest body a request may send and whether the
	// server buffers it.
	limit func(r *http.Request) (max int64, buffered bool)
}

func newBodyGate(budget int64, limit func(*http.Request) (int64, bool)) *bodyGate {
	return &bodyGate{budget: semaphore.NewWeighted(budget), size: budget, limit: limit}
}

// wrap applies the gate and the streaming deadlines to h.
func (g *bodyGate) wrap(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rc := http.NewResponseController(w)
		max, buffered := g.limit(r)
		if r.ContentLength > max {
			refuse(w, http.StatusRequestEntityTooLarge, runbox.ETooLarge,
				"the request body is larger than "+strconv.FormatInt(max, 10)+" bytes")
			return
		}
		reserve := int64(0)
		if buffered && r.Body != nil && r.Body != http.NoBody {
			reserve = max
			if r.ContentLength >= 0 {
				reserve = r.ContentLength
			}
			reserve = min(reserve, g.size)
		}
		if reserve > 0 {
			ctx, cancel := context.WithTimeout(r.Context(), budgetWait)
			err := g.budget.Acquire(ctx, reserve)
			cancel()
			if err != nil {
				w.Header().Set("Retry-After", "1")
				refuse(w, http.StatusServiceUnavailable, runbox.EBusy, "the server is busy; retry shortly")
				return
			}
		}
		body := &gatedBody{r: http.MaxBytesReader(w, r.Body, max), rc: rc, gate: g, reserved: reserve, length: r.ContentLength}
		defer body.release()
		if reserve > 0 {
			// A batch gives its share back once decoded and checked,
			// before it waits on its callbacks' DNS (runs.ReleaseBody).
			r = r.WithContext(runs.WithBody(r.Context(), body.release))
		}
		if r.Body == nil || r.Body == http.NoBody || r.ContentLength == 0 {
			// Nothing to read: the handler may stream for as long as it
			// needs.
			_ = rc.SetReadDeadline(time.Time{})
		} else {
			r.Body = body
		}
		h.ServeHTTP(&stallWriter{ResponseWriter: w, rc: rc}, r)
	})
}

// gatedBody is a request body under the gate: once it has been read to
// its end it lifts the read deadline (the rest of the exchange is the
// handler's) and gives back the budget it reserved beyond its real size.
type gatedBody struct {
	r    io.ReadCloser
	rc   *http.ResponseController
	gate *bodyGate

	length int64 // declared; -1 if unknown

	mu       sync.Mutex
	n        int64 // bytes read
	reserved int64
	done     bool
}

func (b *gatedBody) Read(p []byte) (int, error) {
	n, err := b.r.Read(p)
	b.mu.Lock()
	defer b.mu.Unlock()
	b.n += int64(n)
	// A decoder may stop at the end of its value without asking for EOF:
	// a body of declared length is done when that much has come.
	if (err == io.EOF || b.length >= 0 && b.n >= b.length) && !b.done {
		b.done = true
		_ = b.rc.SetReadDeadline(time.Time{})
		if extra := b.reserved - b.n; extra > 0 {
			b.gate.budget.Release(extra)
			b.reserved = b.n
		}
	}
	return n, err
}

func (b *gatedBody) Close() error { return b.r.Close() }

// release gives back what the body still holds of the budget, when its
// request is done.
func (b *gatedBody) release() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.reserved > 0 {
		b.gate.budget.Release(b.reserved)
		b.reserved = 0
	}
}

// stallWriter gives every write WriteStall to complete, however long the
// response has been streaming.
type stallWriter struct {
	http.ResponseWriter
	rc *http.ResponseController
}

func (w *stallWriter) Write(p []byte) (int, error) {
	_ = w.rc.SetWriteDeadline(time.Now().Add(WriteStall))
	return w.ResponseWriter.Write(p)
}

func (w *stallWriter) Flush() {
	_ = w.rc.SetWriteDeadline(time.Now().Add(WriteStall))
	_ = w.rc.Flush()
}

// Unwrap lets http.ResponseController reach the connection's writer.
func (w *stallWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

func refuse(w http.ResponseWriter, status int, code, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Connection", "close")
	w.WriteHeader(status)
	_, _ = io.WriteString(w, `{"error":"`+code+`","message":"`+msg+`"}`)
}

// routeLimit is the body limit of each route: MCP messages and the upload
// tool's base64 up to maxBody, REST JSON up to maxRunBody (a batch up to
// maxBatchBody), a REST upload
// (streamed to disk) up to maxUpload, and nothing of note elsewhere.
func routeLimit(maxBody, maxUpload int64) func(*http.Request) (int64, bool) {
	return func(r *http.Request) (int64, bool) {
		p := r.URL.Path
		switch {
		case p == "/mcp" || strings.HasPrefix(p, "/mcp/"):
			return maxBody, true
		case r.Method == http.MethodPut && strings.HasPrefix(p, "/v1/conversations/"):
			return maxUpload, false
		case r.Method == http.MethodPost && p == "/v1/batches":
			return maxBatchBody, true
		case strings.HasPrefix(p, "/v1/"):
			return maxRunBody, true
		}
		return 64 << 10, true
	}
}

// requestCap bounds the requests each client has in flight: its tier's
// concurrent_requests, or DefaultMaxRequestsPerClient.
type requestCap struct{ f *clients.InFlight }

// newRequestCap counts in f; nil: a count of its own.
func newRequestCap(f *clients.InFlight) *requestCap {
	if f == nil {
		f = clients.NewInFlight(DefaultMaxRequestsPerClient)
	}
	return &requestCap{f: f}
}

// middleware refuses a request of a client that has its maximum in
// flight; it runs after the token check, which names the client.
func (c *requestCap) middleware(next echo.HandlerFunc) echo.HandlerFunc {
	return func(ec echo.Context) error {
		ctx := ec.Request().Context()
		release, ok := c.f.Acquire(auth.Client(ctx), auth.Tier(ctx))
		if !ok {
			ec.Response().Header().Set("Retry-After", "1")
			return errTooManyRequests
		}
		defer release()
		return next(ec)
	}
}

var errTooManyRequests = runbox.Errorf(runbox.ERateLimited, "too many requests in flight for this client; retry when one has finished")
