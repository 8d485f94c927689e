package api

import (
	"net"
	"net/http"
	"net/url"
	"strings"

	"github.com/runbox-dev/runbox"
)

// An originGuard refuses requests a browser sends from a web page the
// server does not trust: the MCP specification asks Streamable HTTP
// servers to check Origin, so that a page whose name was rebound to the
// server's address (DNS rebinding) cannot drive it. Clients that are not
// browsers send no Origin and pass; a browser's request passes when it
// comes from the server's own pages (PUBLIC_BASE_URL's origin, where the
// playground is) or from an origin the operator listed
// (MCP_ALLOWED_ORIGINS). The Host header is never trusted for this: a
// rebound name makes it the attacker's.
type originGuard struct {
	allowed map[string]bool // by canonical origin
	guarded func(path string) bool
}

// newOriginGuard accepts origins on the routes guarded selects. An origin
// on a loopback name (localhost, 127.0.0.1, [::1]) also accepts the
// others at the same port: they name the same server, and no rebound name
// is one of them.
func newOriginGuard(origins []string, guarded func(path string) bool) *originGuard {
	g := &originGuard{allowed: map[string]bool{}, guarded: guarded}
	for _, o := range origins {
		u, ok := parseOrigin(o)
		if !ok {
			continue
		}
		g.allowed[u.String()] = true
		if host := u.Hostname(); host == "localhost" || isLoopbackIP(host) {
			for _, alias := range []string{"localhost", "127.0.0.1", "[::1]"} {
				g.allowed[u.Scheme+"://"+alias+portSuffix(u)] = true
			}
		}
	}
	return g
}

// wrap refuses, with 403, a guarded request from an origin not accepted,
// before h sees it.
func (g *originGuard) wrap(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if g.guarded(r.URL.Path) && !g.accepts(r.Header.Values("Origin")) {
			refuse(w, http.StatusForbidden, runbox.EForbidden, "requests from this web origin are not accepted")
			return
		}
		h.ServeHTTP(w, r)
	})
}

// accepts reports whether a request with these Origin headers may go on:
// none, or one that is allowed ("null", an opaque origin, never is).
func (g *originGuard) accepts(origins []string) bool {
	switch len(origins) {
	case 0:
		return true
	case 1:
		u, ok := parseOrigin(origins[0])
		return ok && g.allowed[u.String()]
	}
	return false
}

// apiRoute selects the routes a page elsewhere must not reach: MCP,
// REST and E2B's API. Downloads are signed links, the playground and health checks are
// plain pages.
func apiRoute(path string) bool {
	return path == "/mcp" || strings.HasPrefix(path, "/mcp/") || path == "/v1" || strings.HasPrefix(path, "/v1/") ||
		path == E2BPrefix || strings.HasPrefix(path, E2BPrefix+"/")
}

// parseOrigin reads an origin, scheme://host[:port], into a canonical
// form: lower case, the scheme's default port dropped.
func parseOrigin(s string) (*url.URL, bool) {
	u, err := url.Parse(strings.TrimSpace(s))
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || u.User != nil ||
		(u.Path != "" && u.Path != "/") || u.RawQuery != "" || u.Fragment != "" {
		return nil, false
	}
	c := &url.URL{Scheme: strings.ToLower(u.Scheme), Host: strings.ToLower(u.Hostname())}
	if strings.Contains(c.Host, ":") {
		c.Host = "[" + c.Host + "]"
	}
	if port := u.Port(); port != "" && !(c.Scheme == "http" && port == "80") && !(c.Scheme == "https" && port == "443") {
		c.Host += ":" + port
	}
	return c, true
}

func portSuffix(u *url.URL) string {
	if p := u.Port(); p != "" {
		return ":" + p
	}
	return ""
}

func isLoopbackIP(host string) bool {
	ip := net.ParseIP(strings.Trim(host, "[]"))
	return ip != nil && ip.IsLoopback()
}
