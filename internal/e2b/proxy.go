package e2b

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httputil"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/runbox-dev/runbox"
	"github.com/runbox-dev/runbox/internal/e2b/envd"
	"github.com/runbox-dev/runbox/internal/link"
)

// A sandbox's ports are reached as previews are: through the executor
// that holds its conversation (package link), which dials the port in
// the sandbox. The executor and the sandboxes found serving the daemon
// are kept a few seconds per sandbox.

// targetTTL is how long a sandbox's target is trusted without a probe.
const targetTTL = 5 * time.Second

var errUnplaced = errors.New("e2b: the sandbox's conversation is on no executor yet")

// target is where a sandbox's daemon is.
type target struct {
	executor  string
	sandboxes []string
	at        time.Time
}

type targets struct {
	s  *Service
	mu sync.Mutex
	m  map[string]target // by sandbox id
}

func newTargets(s *Service) *targets { return &targets{s: s, m: map[string]target{}} }

func convKey(sb runbox.E2BSandbox) string {
	key, _ := runbox.ConversationKey(sb.Client, sb.ID)
	return key
}

// find returns where sb's daemon is, probing its executor when the last
// look is old: link.ErrNotListening while it starts, errUnplaced before
// its run is claimed.
func (t *targets) find(ctx context.Context, sb runbox.E2BSandbox) (target, error) {
	now := t.s.clock.Now()
	t.mu.Lock()
	tg, ok := t.m[sb.ID]
	t.mu.Unlock()
	if ok && now.Sub(tg.at) < targetTTL {
		return tg, nil
	}
	key := convKey(sb)
	owner, err := t.s.store.Owner(ctx, key)
	if err != nil {
		return target{}, err
	}
	if owner == "" {
		return target{}, errUnplaced
	}
	sandboxes, err := t.s.link.Probe(ctx, owner, key, envdPort)
	if err != nil {
		return target{}, err
	}
	tg = target{executor: owner, sandboxes: sandboxes, at: now}
	t.mu.Lock()
	if len(t.m) >= maxTargets {
		// Sandboxes that ended without a word here (their conversation
		// closed by runbox's own tools) leave their targets: old ones go.
		for id, old := range t.m {
			if now.Sub(old.at) >= targetTTL {
				delete(t.m, id)
			}
		}
	}
	t.m[sb.ID] = tg
	t.mu.Unlock()
	return tg, nil
}

// maxTargets is how many targets are kept before the old ones are
// dropped.
const maxTargets = 10000

func (t *targets) forget(id string) {
	t.mu.Lock()
	delete(t.m, id)
	t.mu.Unlock()
}

// dial opens a stream to port in sb's sandbox, looking again once when
// the target known was gone.
func (t *targets) dial(ctx context.Context, sb runbox.E2BSandbox, port int) (net.Conn, error) {
	for attempt := 0; ; attempt++ {
		tg, err := t.find(ctx, sb)
		if err != nil {
			return nil, err
		}
		c, err := t.s.link.Dial(ctx, tg.executor, convKey(sb), port, tg.sandboxes)
		if errors.Is(err, link.ErrGone) && attempt == 0 {
			t.forget(sb.ID)
			continue
		}
		return c, err
	}
}

// proxy forwards requests to a sandbox's ports.
type proxy struct {
	s  *Service
	tr *http.Transport
	rp *httputil.ReverseProxy
}

type routeKey struct{}

// route is where a request goes: a sandbox's port.
type route struct {
	sb   runbox.E2BSandbox
	port int
	path string
	// api says the request came on the api's host (header routing): the
	// answer is served on the api's origin and kept from being a page.
	api bool
}

// poolHost names a sandbox's port in the transport's pool.
func poolHost(id string, port int) string { return fmt.Sprintf("%s-%d.e2b.invalid", id, port) }

func newProxy(s *Service) *proxy {
	p := &proxy{s: s}
	p.tr = &http.Transport{
		DialContext:         p.dial,
		MaxIdleConnsPerHost: 8,
		IdleConnTimeout:     90 * time.Second,
		// The daemon answers at once or streams: a head that takes longer
		// is a sandbox that hangs.
		ResponseHeaderTimeout: time.Minute,
	}
	p.rp = &httputil.ReverseProxy{
		Rewrite:        rewrite,
		Transport:      p.tr,
		FlushInterval:  -1, // a process's events as they come
		ModifyResponse: modifyResponse,
		ErrorHandler:   p.fail,
		ErrorLog:       slog.NewLogLogger(s.log.Handler(), slog.LevelDebug),
	}
	return p
}

// dial is the transport's: a stream to the request's sandbox's port.
func (p *proxy) dial(ctx context.Context, _, addr string) (net.Conn, error) {
	rt, ok := ctx.Value(routeKey{}).(*route)
	if !ok || addr != poolHost(rt.sb.ID, rt.port)+":80" {
		return nil, errors.New("e2b: dial without its sandbox")
	}
	return p.s.targets.dial(ctx, rt.sb, rt.port)
}

// Headers that never reach a sandbox: the caller's credentials and
// routing, and runbox's own.
var dropRequest = []string{headerAPIKey, headerAccessToken, headerTrafficToken, headerSandboxID, headerSandboxPort,
	"Proxy-Authorization", "Cookie"}

// rewrite points a request at its sandbox's port.
func rewrite(pr *httputil.ProxyRequest) {
	rt := pr.In.Context().Value(routeKey{}).(*route)
	pr.Out.URL.Scheme, pr.Out.URL.Host = "http", poolHost(rt.sb.ID, rt.port)
	pr.Out.URL.Path, pr.Out.URL.RawPath = rt.path, ""
	if !rt.api {
		pr.Out.Host = pr.In.Host
	}
	pr.SetXForwarded()
	for _, h := range dropRequest {
		pr.Out.Header.Del(h)
	}
	// The daemon reads the user a call is made as from Basic credentials;
	// anything else (a bearer token: the API key) goes no further.
	if a := pr.Out.Header.Get("Authorization"); a != "" && !strings.HasPrefix(a, "Basic ") {
		pr.Out.Header.Del("Authorization")
	}
	for k := range pr.Out.Header {
		if strings.HasPrefix(strings.ToLower(k), "x-runbox-") {
			pr.Out.Header.Del(k)
		}
	}
}

// modifyResponse keeps what a sandbox answers from acting as the api's:
// no cookies, and on the api's host no page at all.
func modifyResponse(resp *http.Response) error {
	rt := resp.Request.Context().Value(routeKey{}).(*route)
	resp.Header.Del("Set-Cookie")
	resp.Header.Del("Clear-Site-Data")
	if rt.api {
		resp.Header.Set("Content-Security-Policy", "sandbox")
		resp.Header.Set("X-Content-Type-Options", "nosniff")
	}
	return nil
}

// fail answers a request the proxy could not complete: the sandbox's
// daemon or port is not there (502, as E2B's proxy says so, which the
// SDKs read as the sandbox's end).
func (p *proxy) fail(w http.ResponseWriter, r *http.Request, err error) {
	rt, _ := r.Context().Value(routeKey{}).(*route)
	if r.Context().Err() != nil {
		return // the caller went
	}
	p.s.targets.forget(rt.sb.ID)
	msg := "The sandbox is not running, or its daemon does not answer."
	switch {
	case errors.Is(err, errBodyTooLarge):
		writeJSON(w, http.StatusRequestEntityTooLarge, apiError{Code: http.StatusRequestEntityTooLarge, SandboxID: rt.sb.ID,
			Message: fmt.Sprintf("the request body is larger than %d bytes", p.s.limits.MaxUpload)})
		return
	case errors.Is(err, link.ErrNotListening) && rt.port != envdPort:
		msg = fmt.Sprintf("The sandbox is running but port %d is not open.", rt.port)
	case errors.Is(err, link.ErrGone), errors.Is(err, link.ErrNotListening), errors.Is(err, errUnplaced):
		// Its daemon went: if its run is over, the sandbox is.
		go func() {
			ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), 30*time.Second)
			defer cancel()
			_, _ = p.s.check(ctx, rt.sb)
		}()
	default:
		p.s.log.Debug("proxy a sandbox's request", "sandbox", rt.sb.ID, "port", rt.port, "err", err)
	}
	writeJSON(w, http.StatusBadGateway, apiError{Code: http.StatusBadGateway, Message: msg, SandboxID: rt.sb.ID})
}

// serve forwards r to rt.
func (p *proxy) serve(w http.ResponseWriter, r *http.Request, rt *route) {
	p.rp.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), routeKey{}, rt)))
}

// metrics reads a running sandbox's use from its daemon.
func (p *proxy) metrics(ctx context.Context, sb runbox.E2BSandbox) (envd.Metrics, error) {
	rt := &route{sb: sb, port: envdPort, path: "/metrics"}
	ctx, cancel := context.WithTimeout(context.WithValue(ctx, routeKey{}, rt), 10*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+poolHost(sb.ID, envdPort)+"/metrics", nil)
	if err != nil {
		return envd.Metrics{}, err
	}
	resp, err := p.tr.RoundTrip(req)
	if err != nil {
		return envd.Metrics{}, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return envd.Metrics{}, fmt.Errorf("the daemon answered %s", strconv.Itoa(resp.StatusCode))
	}
	var m envd.Metrics
	err = json.NewDecoder(io.LimitReader(resp.Body, 64<<10)).Decode(&m)
	return m, err
}
