package api

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"testing"

	"github.com/jonboulle/clockwork"
	"github.com/labstack/echo/v4"

	"github.com/runbox-dev/runbox/internal/audit"
	"github.com/runbox-dev/runbox/internal/auth"
	"github.com/runbox-dev/runbox/internal/clients"
	"github.com/runbox-dev/runbox/internal/refusals"
	"github.com/runbox-dev/runbox/internal/store"
	"github.com/runbox-dev/runbox/internal/store/auditlog"
	"github.com/runbox-dev/runbox/internal/testenv"
)

const goodToken = "good-token-0123456789"

// guarded is a route behind requireToken, with the audit log in a real
// redis-server, as the api has it.
func guarded(t *testing.T, trusted ...netip.Prefix) (*echo.Echo, func() int64) {
	t.Helper()
	url := testenv.Redis(t)
	rdb := testenv.Client(t, url)
	log := slog.New(slog.NewTextHandler(io.Discard, nil))
	cs, err := clients.Load(goodToken, "", "")
	if err != nil {
		t.Fatal(err)
	}
	lim := refusals.New(refusals.Options{Budget: 20, Audit: audit.NewRecorder(auditlog.New(store.NewConn(rdb)), clockwork.NewRealClock(), log)})
	s := &Server{opts: Options{Tokens: auth.NewTokens(cs), Refusals: lim}, log: log}
	e := echo.New()
	e.HTTPErrorHandler = s.handleError
	e.IPExtractor = ipExtractor(trusted)
	e.GET("/v1/runners", func(c echo.Context) error { return c.String(http.StatusOK, "ok") }, s.requireToken(false))
	entries := func() int64 { return rdb.XLen(context.Background(), "runbox:audit:raw").Val() }
	return e, entries
}

func get(e *echo.Echo, from, token string, header ...string) *httptest.ResponseRecorder {
	req := httptest.NewRequest(http.MethodGet, "/v1/runners", nil)
	req.RemoteAddr = from + ":40000"
	req.Header.Set("Authorization", "Bearer "+token)
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	rec := httptest.NewRecorder()
	e.ServeHTTP(rec, req)
	return rec
}

// TestRefusedRequestsCostRedisPerSource: 3000 requests with a wrong token
// from one address used to write 6000 audit entries; now they write one
// (the first; the count follows when the window ends), the address past
// its budget is answered 429, and a valid token passes all the same —
// from another address or from the stranger's own (a NAT, a proxy).
func TestRefusedRequestsCostRedisPerSource(t *testing.T) {
	e, entries := guarded(t)
	codes := map[int]int{}
	for range 3000 {
		codes[get(e, "192.0.2.7", "wrong-token-000000000").Code]++
	}
	if codes[http.StatusUnauthorized] != 20 || codes[http.StatusTooManyRequests] != 2980 {
		t.Errorf("answers %v: want 20 × 401, then 429", codes)
	}
	if rec := get(e, "192.0.2.7", "wrong"); rec.Header().Get("Retry-After") == "" {
		t.Error("a 429 without Retry-After")
	}
	if n := entries(); n > 2 {
		t.Errorf("3000 refused requests wrote %d audit entries", n)
	}
	for _, from := range []string{"198.51.100.1", "192.0.2.7"} {
		if rec := get(e, from, goodToken); rec.Code != http.StatusOK {
			t.Errorf("a valid token from %s: %d %s", from, rec.Code, rec.Body)
		}
	}
}

// X-Forwarded-For names the source only when the peer is a proxy the
// operator trusts: a stranger cannot spread its flood over made-up
// addresses, and behind a trusted proxy each client has its own budget.
func TestRefusalsSource(t *testing.T) {
	e, _ := guarded(t)
	for i := range 30 {
		get(e, "192.0.2.7", "wrong", "X-Forwarded-For", netip.AddrFrom4([4]byte{203, 0, 113, byte(i)}).String())
	}
	if rec := get(e, "192.0.2.7", "wrong", "X-Forwarded-For", "203.0.113.200"); rec.Code != http.StatusTooManyRequests {
		t.Errorf("made-up X-Forwarded-For: %d, want 429 (one source)", rec.Code)
	}

	proxied, _ := guarded(t, netip.MustParsePrefix("127.0.0.1/32"))
	for range 30 {
		get(proxied, "127.0.0.1", "wrong", "X-Forwarded-For", "203.0.113.9")
	}
	if rec := get(proxied, "127.0.0.1", "wrong", "X-Forwarded-For", "203.0.113.9"); rec.Code != http.StatusTooManyRequests {
		t.Errorf("the stranger behind the proxy: %d, want 429", rec.Code)
	}
	if rec := get(proxied, "127.0.0.1", "wrong", "X-Forwarded-For", "203.0.113.10"); rec.Code != http.StatusUnauthorized {
		t.Errorf("another client behind the proxy: %d, want 401", rec.Code)
	}
}
