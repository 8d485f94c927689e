package e2b

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/runbox-dev/runbox"
	"github.com/runbox-dev/runbox/internal/audit"
	"github.com/runbox-dev/runbox/internal/e2b/envd"
)

// The control plane: E2B's REST API (spec/openapi.yml's sandboxes), as
// far as runbox offers it. Shapes and names are E2B's.

// maxControlBody bounds a control-plane request's body.
const maxControlBody = 256 << 10

// controlHandler is a control-plane route's handler: the request carries
// its client; what it returns is written (nil: it wrote its answer).
type controlHandler func(w http.ResponseWriter, r *http.Request) error

// controlRoute is a control-plane route: its pattern (method and path
// under Prefix) and its handler.
type controlRoute struct {
	pattern string
	handle  controlHandler
}

// controlRoutes are the control plane's routes, each in
// docs/e2b-openapi.yaml (TestDocumentRoutes).
func (h *Handler) controlRoutes() []controlRoute {
	return []controlRoute{
		{"POST /sandboxes", h.create},
		{"GET /sandboxes", h.listRunning},
		{"GET /v2/sandboxes", h.list},
		{"GET /sandboxes/metrics", h.metricsOfMany},
		{"GET /sandboxes/{sandboxID}", h.get},
		{"DELETE /sandboxes/{sandboxID}", h.kill},
		{"POST /sandboxes/{sandboxID}/timeout", h.setTimeout},
		{"POST /sandboxes/{sandboxID}/refreshes", h.refresh},
		{"POST /sandboxes/{sandboxID}/pause", h.pause},
		{"POST /sandboxes/{sandboxID}/resume", h.resume},
		{"POST /sandboxes/{sandboxID}/connect", h.connect},
		{"GET /sandboxes/{sandboxID}/metrics", h.metrics},
	}
}

// routes serves the control plane's routes.
func (h *Handler) routes() *http.ServeMux {
	mux := http.NewServeMux()
	for _, cr := range h.controlRoutes() {
		method, path, _ := strings.Cut(cr.pattern, " ")
		route := method + " " + Prefix + path
		mux.HandleFunc(route, func(w http.ResponseWriter, r *http.Request) { h.serveControl(w, r, route, cr.handle) })
	}
	mux.HandleFunc("GET "+Prefix+"/health", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusOK, map[string]string{"status": "ok"})
	})
	mux.HandleFunc(Prefix+"/", func(w http.ResponseWriter, _ *http.Request) {
		writeJSON(w, http.StatusNotFound, apiError{Code: http.StatusNotFound,
			Message: "not found: runbox offers E2B's sandboxes API (templates, volumes and snapshots are not offered)"})
	})
	return mux
}

// serveControl authenticates a control-plane request, counts it against
// its client's tier, records it, and runs f.
func (h *Handler) serveControl(w http.ResponseWriter, r *http.Request, route string, f controlHandler) {
	r, ok := h.authenticate(w, r, route)
	if !ok {
		return
	}
	release, ok := h.admit(w, r)
	if !ok {
		return
	}
	defer release()
	r.Body = http.MaxBytesReader(w, r.Body, maxControlBody)
	end, ok := h.record(w, r, audit.Entry{Client: clientOf(r.Context()), Route: route, Conversation: r.PathValue("sandboxID"),
		Params: audit.Sanitize(queryParams(r.URL.Query()))})
	if !ok {
		return
	}
	err := f(w, r)
	end(errorCode(err))
	if err != nil {
		if errors.Is(err, runbox.ErrE2BSandboxNotFound) {
			err = runbox.Errorf(runbox.ENotFound, "sandbox %s not found", clip(r.PathValue("sandboxID"), 64))
		}
		h.writeError(w, r, err)
	}
}

func queryParams(q url.Values) map[string]any {
	out := map[string]any{}
	for k, v := range q {
		out[k] = strings.Join(v, ",")
	}
	return out
}

// decode reads a JSON body into v; an empty body leaves v as it is.
func decode(r *http.Request, v any) error {
	err := json.NewDecoder(r.Body).Decode(v)
	if err == nil || errors.Is(err, io.EOF) {
		return nil
	}
	return runbox.Errorf(runbox.EInvalid, "the body is not the JSON expected: %s", clip(err.Error(), 200))
}

// sandboxJSON is E2B's Sandbox: what create, connect and resume answer.
type sandboxJSON struct {
	TemplateID         string  `json:"templateID"`
	SandboxID          string  `json:"sandboxID"`
	Alias              string  `json:"alias,omitempty"`
	ClientID           string  `json:"clientID"`
	EnvdVersion        string  `json:"envdVersion"`
	EnvdAccessToken    string  `json:"envdAccessToken"`
	TrafficAccessToken string  `json:"trafficAccessToken"`
	Domain             *string `json:"domain"`
}

// clientID is the deprecated clientID E2B's answers carry.
const clientID = "runbox"

func (h *Handler) sandboxJSON(sb runbox.E2BSandbox) sandboxJSON {
	return sandboxJSON{TemplateID: sb.Template, SandboxID: sb.ID, Alias: sb.Template, ClientID: clientID,
		EnvdVersion: envd.Version, EnvdAccessToken: token(h.svc.key, sb, accessToken),
		TrafficAccessToken: token(h.svc.key, sb, trafficToken), Domain: h.domain()}
}

func (h *Handler) domain() *string {
	if h.svc.domain == "" {
		return nil
	}
	d := h.svc.domain
	return &d
}

// listedJSON is E2B's ListedSandbox; detailJSON its SandboxDetail.
type listedJSON struct {
	TemplateID  string            `json:"templateID"`
	Alias       string            `json:"alias,omitempty"`
	SandboxID   string            `json:"sandboxID"`
	ClientID    string            `json:"clientID"`
	StartedAt   time.Time         `json:"startedAt"`
	EndAt       time.Time         `json:"endAt"`
	CPUCount    int               `json:"cpuCount"`
	MemoryMB    int64             `json:"memoryMB"`
	DiskSizeMB  int64             `json:"diskSizeMB"`
	Metadata    map[string]string `json:"metadata"`
	State       string            `json:"state"`
	EnvdVersion string            `json:"envdVersion"`
}

type detailJSON struct {
	listedJSON
	EnvdAccessToken     string        `json:"envdAccessToken"`
	AllowInternetAccess *bool         `json:"allowInternetAccess"`
	Domain              *string       `json:"domain"`
	Lifecycle           lifecycleJSON `json:"lifecycle"`
}

type lifecycleJSON struct {
	AutoResume bool   `json:"autoResume"`
	OnTimeout  string `json:"onTimeout"`
}

func (h *Handler) listedJSON(sb runbox.E2BSandbox) listedJSON {
	md := sb.Metadata
	if md == nil {
		md = map[string]string{}
	}
	res := h.opts.Resources
	return listedJSON{TemplateID: sb.Template, Alias: sb.Template, SandboxID: sb.ID, ClientID: clientID,
		StartedAt: sb.StartedAt.UTC(), EndAt: sb.EndAt.UTC(), CPUCount: res.CPUs, MemoryMB: res.MemoryMB,
		DiskSizeMB: res.DiskSizeMB, Metadata: md, State: sb.State, EnvdVersion: envd.Version}
}

func (h *Handler) detailJSON(sb runbox.E2BSandbox) detailJSON {
	onTimeout := "kill"
	if sb.AutoPause {
		onTimeout = "pause"
	}
	return detailJSON{listedJSON: h.listedJSON(sb), EnvdAccessToken: token(h.svc.key, sb, accessToken),
		AllowInternetAccess: sb.AllowInternet, Domain: h.domain(),
		Lifecycle: lifecycleJSON{AutoResume: sb.AutoResume, OnTimeout: onTimeout}}
}

func (h *Handler) create(w http.ResponseWriter, r *http.Request) error {
	var body newSandboxJSON
	if err := decode(r, &body); err != nil {
		return err
	}
	req, err := h.svc.createRequest(r.Context(), body)
	if err != nil {
		return err
	}
	sb, err := h.svc.Create(r.Context(), req)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusCreated, h.sandboxJSON(sb))
	return nil
}

// listRunning is GET /sandboxes: the client's running sandboxes.
func (h *Handler) listRunning(w http.ResponseWriter, r *http.Request) error {
	md, err := metadataQuery(r.URL.Query().Get("metadata"))
	if err != nil {
		return err
	}
	var out []listedJSON
	q := Query{Metadata: md, States: []string{runbox.E2BRunning}, Limit: 100}
	for {
		page, next, err := h.svc.List(r.Context(), q)
		if err != nil {
			return err
		}
		for _, sb := range page {
			out = append(out, h.listedJSON(sb))
		}
		if next == "" || len(out) >= 1000 {
			break
		}
		q.Next = next
	}
	if out == nil {
		out = []listedJSON{}
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

// list is GET /v2/sandboxes: a page of the client's sandboxes, by state
// and metadata; x-next-token says where the next page starts.
func (h *Handler) list(w http.ResponseWriter, r *http.Request) error {
	query := r.URL.Query()
	md, err := metadataQuery(query.Get("metadata"))
	if err != nil {
		return err
	}
	q := Query{Metadata: md, Next: query.Get("nextToken")}
	if s := query.Get("state"); s != "" {
		for st := range strings.SplitSeq(s, ",") {
			if st != runbox.E2BRunning && st != runbox.E2BPaused {
				return runbox.Errorf(runbox.EInvalid, "state must be running or paused")
			}
			q.States = append(q.States, st)
		}
	}
	if l := query.Get("limit"); l != "" {
		if q.Limit, err = strconv.Atoi(l); err != nil || q.Limit < 1 || q.Limit > 100 {
			return runbox.Errorf(runbox.EInvalid, "limit must be between 1 and 100")
		}
	}
	page, next, err := h.svc.List(r.Context(), q)
	if err != nil {
		return err
	}
	out := make([]listedJSON, 0, len(page))
	for _, sb := range page {
		out = append(out, h.listedJSON(sb))
	}
	if next != "" {
		w.Header().Set("X-Next-Token", next)
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

// metadataQuery reads a listing's metadata filter: a query string of
// keys and values, each itself URL-encoded.
func metadataQuery(s string) (map[string]string, error) {
	if s == "" {
		return nil, nil
	}
	vals, err := url.ParseQuery(s)
	if err != nil {
		return nil, runbox.Errorf(runbox.EInvalid, "metadata is not a query string (key=value&...)")
	}
	md := map[string]string{}
	for k, v := range vals {
		key, err1 := url.QueryUnescape(k)
		val, err2 := url.QueryUnescape(v[0])
		if err1 != nil || err2 != nil {
			return nil, runbox.Errorf(runbox.EInvalid, "metadata holds a badly encoded key or value")
		}
		md[key] = val
	}
	return md, nil
}

func (h *Handler) get(w http.ResponseWriter, r *http.Request) error {
	sb, err := h.svc.Get(r.Context(), r.PathValue("sandboxID"))
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, h.detailJSON(sb))
	return nil
}

func (h *Handler) kill(w http.ResponseWriter, r *http.Request) error {
	if err := h.svc.Kill(r.Context(), r.PathValue("sandboxID")); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// timeoutJSON is what /timeout and /connect take; refreshJSON /refreshes.
type timeoutJSON struct {
	Timeout *int `json:"timeout"`
}

type refreshJSON struct {
	Duration *int `json:"duration"`
}

// seconds checks a timeout in seconds: at least 0, at most the longest a
// sandbox lives.
func (h *Handler) seconds(v *int, name string, fallback int) (time.Duration, error) {
	n := fallback
	if v != nil {
		n = *v
	}
	if n < 0 || time.Duration(n)*time.Second > h.svc.limits.MaxTimeout {
		return 0, runbox.Errorf(runbox.EInvalid, "%s must be between 0 and %d seconds", name, int(h.svc.limits.MaxTimeout/time.Second))
	}
	return time.Duration(n) * time.Second, nil
}

// timeoutOf reads a body's timeout (seconds); fallback when it says
// none, and when fallback is negative it must say one.
func (h *Handler) timeoutOf(r *http.Request, fallback int) (time.Duration, error) {
	var body timeoutJSON
	if err := decode(r, &body); err != nil {
		return 0, err
	}
	if body.Timeout == nil && fallback < 0 {
		return 0, runbox.Errorf(runbox.EInvalid, "timeout is required")
	}
	return h.seconds(body.Timeout, "timeout", fallback)
}

func (h *Handler) setTimeout(w http.ResponseWriter, r *http.Request) error {
	d, err := h.timeoutOf(r, -1)
	if err != nil {
		return err
	}
	if err := h.svc.SetTimeout(r.Context(), r.PathValue("sandboxID"), d); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// refresh extends a sandbox's life by a duration from now (E2B's
// default: its timeout at creation is not known here; 60 s).
func (h *Handler) refresh(w http.ResponseWriter, r *http.Request) error {
	var body refreshJSON
	if err := decode(r, &body); err != nil {
		return err
	}
	d, err := h.seconds(body.Duration, "duration", 60)
	if err != nil {
		return err
	}
	if _, _, err := h.svc.Connect(r.Context(), r.PathValue("sandboxID"), d); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

func (h *Handler) pause(w http.ResponseWriter, r *http.Request) error {
	if err := h.svc.Pause(r.Context(), r.PathValue("sandboxID")); err != nil {
		return err
	}
	w.WriteHeader(http.StatusNoContent)
	return nil
}

// resume is E2B's deprecated resume: a paused sandbox runs again; a
// running one is a conflict.
func (h *Handler) resume(w http.ResponseWriter, r *http.Request) error {
	d, err := h.timeoutOf(r, 15)
	if err != nil {
		return err
	}
	sb, err := h.svc.Get(r.Context(), r.PathValue("sandboxID"))
	if err != nil {
		return err
	}
	if sb.State != runbox.E2BPaused {
		return runbox.Errorf(runbox.EConversationExists, "sandbox %s is already running", sb.ID)
	}
	sb, _, err = h.svc.Connect(r.Context(), sb.ID, d)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusCreated, h.sandboxJSON(sb))
	return nil
}

// connect returns a sandbox running: 201 when it was resumed, 200 when it
// ran already.
func (h *Handler) connect(w http.ResponseWriter, r *http.Request) error {
	d, err := h.timeoutOf(r, 15)
	if err != nil {
		return err
	}
	sb, resumed, err := h.svc.Connect(r.Context(), r.PathValue("sandboxID"), d)
	if err != nil {
		return err
	}
	status := http.StatusOK
	if resumed {
		status = http.StatusCreated
	}
	writeJSON(w, status, h.sandboxJSON(sb))
	return nil
}

// metricJSON is E2B's SandboxMetric.
type metricJSON struct {
	Timestamp     time.Time `json:"timestamp"`
	TimestampUnix int64     `json:"timestampUnix"`
	CPUCount      int       `json:"cpuCount"`
	CPUUsedPct    float64   `json:"cpuUsedPct"`
	MemUsed       int64     `json:"memUsed"`
	MemTotal      int64     `json:"memTotal"`
	MemCache      int64     `json:"memCache"`
	DiskUsed      int64     `json:"diskUsed"`
	DiskTotal     int64     `json:"diskTotal"`
}

// metrics answers a sandbox's use now (one point; none while paused).
func (h *Handler) metrics(w http.ResponseWriter, r *http.Request) error {
	sb, err := h.svc.Get(r.Context(), r.PathValue("sandboxID"))
	if err != nil {
		return err
	}
	out := []metricJSON{}
	if sb.State == runbox.E2BRunning {
		m, err := h.metricOf(r.Context(), sb)
		if err != nil {
			return err
		}
		out = append(out, m)
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

// maxMetricsIDs bounds the sandboxes one /sandboxes/metrics names.
const maxMetricsIDs = 100

// metricsOfMany answers the use now of the caller's running sandboxes
// named (sandbox_ids).
func (h *Handler) metricsOfMany(w http.ResponseWriter, r *http.Request) error {
	ids := strings.Split(r.URL.Query().Get("sandbox_ids"), ",")
	if len(ids) > maxMetricsIDs {
		return runbox.Errorf(runbox.EInvalid, "sandbox_ids names more than %d sandboxes", maxMetricsIDs)
	}
	out := map[string]metricJSON{}
	for _, id := range ids {
		sb, err := h.svc.Get(r.Context(), id)
		if err != nil || sb.State != runbox.E2BRunning {
			continue
		}
		if m, err := h.metricOf(r.Context(), sb); err == nil {
			out[id] = m
		}
	}
	writeJSON(w, http.StatusOK, map[string]any{"sandboxes": out})
	return nil
}

// metricOf reads a running sandbox's use from its daemon, which reads its
// cgroup and its home's file system.
func (h *Handler) metricOf(ctx context.Context, sb runbox.E2BSandbox) (metricJSON, error) {
	m, err := h.proxy.metrics(ctx, sb)
	if err != nil {
		return metricJSON{}, runbox.Errorf(runbox.EUnavailable, "the sandbox's metrics cannot be read right now")
	}
	ts := time.Unix(m.TS, 0).UTC()
	return metricJSON{Timestamp: ts, TimestampUnix: m.TS, CPUCount: m.CPUCount, CPUUsedPct: m.CPUUsedPct,
		MemUsed: m.MemUsed, MemTotal: m.MemTotal, MemCache: m.MemCache, DiskUsed: m.DiskUsed, DiskTotal: m.DiskTotal}, nil
}
