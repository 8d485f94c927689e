package e2b

import (
	"context"
	"crypto/sha256"
	"encoding/base64"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/runbox-dev/runbox"
	"github.com/runbox-dev/runbox/internal/egress"
	"github.com/runbox-dev/runbox/internal/runs"
)

// TestTokens: a sandbox's tokens are its own — another sandbox's, another
// kind's, another deployment's or a forged one's are refused — and the
// same from every replica (derived, not stored).
func TestTokens(t *testing.T) {
	key, other := keyOf([]byte("secret")), keyOf([]byte("another deployment"))
	a := runbox.E2BSandbox{ID: newID(), Salt: newSalt()}
	b := runbox.E2BSandbox{ID: newID(), Salt: newSalt()}
	tok := token(key, a, accessToken)
	if tok != token(keyOf([]byte("secret")), a, accessToken) {
		t.Fatal("the token changes between replicas")
	}
	for _, c := range []struct {
		name string
		sb   runbox.E2BSandbox
		kind string
		got  string
		want bool
	}{
		{"its own", a, accessToken, tok, true},
		{"another sandbox's", a, accessToken, token(key, b, accessToken), false},
		{"its traffic token as access token", a, accessToken, token(key, a, trafficToken), false},
		{"another deployment's", a, accessToken, token(other, a, accessToken), false},
		{"same id, another salt (a sandbox made anew)", runbox.E2BSandbox{ID: a.ID, Salt: newSalt()}, accessToken, tok, false},
		{"empty", a, accessToken, "", false},
		{"a prefix", a, accessToken, tok[:20], false},
	} {
		if got := tokenIs(key, c.sb, c.kind, c.got); got != c.want {
			t.Errorf("%s: %v, want %v", c.name, got, c.want)
		}
	}
	if !validID(a.ID) || validID("../etc") || validID(strings.ToUpper(a.ID)) || validID(a.ID+"x") {
		t.Error("validID")
	}
}

// sign signs a /files URL as E2B's SDK does (sandbox/signature.py).
func sign(path, op, user, tok, exp string) string {
	raw := path + ":" + op + ":" + user + ":" + tok
	if exp != "" {
		raw += ":" + exp
	}
	sum := sha256.Sum256([]byte(raw))
	return "v1_" + strings.TrimRight(base64.StdEncoding.EncodeToString(sum[:]), "=")
}

// TestSignature: a signed /files URL is valid for its path, operation and
// user, until its expiry.
func TestSignature(t *testing.T) {
	key := keyOf([]byte("secret"))
	sb := runbox.E2BSandbox{ID: newID(), Salt: newSalt()}
	tok := token(key, sb, accessToken)
	now := time.Unix(1_800_000_000, 0)
	future, past := "1800000100", "1799999900"
	for _, c := range []struct {
		name, path, op, user, sig, exp, why string
	}{
		{"valid", "a.txt", "read", "user", sign("a.txt", "read", "user", tok, ""), "", ""},
		{"valid until", "a.txt", "read", "user", sign("a.txt", "read", "user", tok, future), future, ""},
		{"expired", "a.txt", "read", "user", sign("a.txt", "read", "user", tok, past), past, "signature is already expired"},
		{"another path", "b.txt", "read", "user", sign("a.txt", "read", "user", tok, ""), "", "invalid signature"},
		{"read signature, write", "a.txt", "write", "user", sign("a.txt", "read", "user", tok, ""), "", "invalid signature"},
		{"expiry moved", "a.txt", "read", "user", sign("a.txt", "read", "user", tok, future), "1800000200", "invalid signature"},
		{"another sandbox's token", "a.txt", "read", "user", sign("a.txt", "read", "user", token(key, runbox.E2BSandbox{ID: newID()}, accessToken), ""), "", "invalid signature"},
	} {
		ok, why := signatureValid(key, sb, c.path, c.op, c.user, c.sig, c.exp, now)
		if ok != (c.why == "") || why != c.why {
			t.Errorf("%s: %v %q, want %q", c.name, ok, why, c.why)
		}
	}
}

// TestAuthorize: each port asks for its credential.
func TestAuthorize(t *testing.T) {
	svc := &Service{key: keyOf([]byte("secret"))}
	h := &Handler{svc: svc}
	sb := runbox.E2BSandbox{ID: newID(), Salt: newSalt()}
	private := sb
	private.PrivateTraffic = true
	access, traffic := token(svc.key, sb, accessToken), token(svc.key, sb, trafficToken)
	for _, c := range []struct {
		name   string
		sb     runbox.E2BSandbox
		port   int
		header map[string]string
		ok     bool
	}{
		{"daemon, access token", sb, envdPort, map[string]string{headerAccessToken: access}, true},
		{"daemon, none", sb, envdPort, nil, false},
		{"daemon, traffic token", sb, envdPort, map[string]string{headerTrafficToken: traffic}, false},
		{"daemon, forged", sb, envdPort, map[string]string{headerAccessToken: "forged"}, false},
		{"interpreter, access token", sb, interpreterPort, map[string]string{headerAccessToken: access}, true},
		{"interpreter, traffic token", sb, interpreterPort, map[string]string{headerTrafficToken: traffic}, true},
		{"interpreter, none", sb, interpreterPort, nil, false},
		{"a port of a public sandbox", sb, 8000, nil, true},
		{"a port of a private sandbox, none", private, 8000, nil, false},
		{"a port of a private sandbox, traffic token", private, 8000, map[string]string{headerTrafficToken: traffic}, true},
	} {
		r := httptest.NewRequest(http.MethodGet, "/x", nil)
		for k, v := range c.header {
			r.Header.Set(k, v)
		}
		if msg := h.authorize(r, c.sb, c.port, "/x"); (msg == "") != c.ok {
			t.Errorf("%s: %q", c.name, msg)
		}
	}
}

// TestRewrite: what reaches a sandbox carries none of the caller's
// credentials but the user it names.
func TestRewrite(t *testing.T) {
	in := httptest.NewRequest(http.MethodPost, "/e2b/process.Process/Start", nil)
	for k, v := range map[string]string{headerAPIKey: "key", headerAccessToken: "tok", headerTrafficToken: "tt",
		headerSandboxID: "id", headerSandboxPort: "49983", "Cookie": "runbox=1", "X-Runbox-Client": "alice",
		"Authorization": "Basic dXNlcjo=", "Connect-Protocol-Version": "1"} {
		in.Header.Set(k, v)
	}
	rt := &route{sb: runbox.E2BSandbox{ID: "abc"}, port: envdPort, path: "/process.Process/Start", api: true}
	in = in.WithContext(context.WithValue(in.Context(), routeKey{}, rt))
	pr := &httputil.ProxyRequest{In: in, Out: in.Clone(in.Context())}
	pr.Out.URL = &url.URL{Path: in.URL.Path}
	rewrite(pr)
	for _, h := range []string{headerAPIKey, headerAccessToken, headerTrafficToken, headerSandboxID, headerSandboxPort, "Cookie", "X-Runbox-Client"} {
		if v := pr.Out.Header.Get(h); v != "" {
			t.Errorf("%s reached the sandbox: %q", h, v)
		}
	}
	if pr.Out.Header.Get("Authorization") != "Basic dXNlcjo=" || pr.Out.Header.Get("Connect-Protocol-Version") != "1" {
		t.Errorf("the call's own headers: %v", pr.Out.Header)
	}
	if pr.Out.URL.Path != "/process.Process/Start" || pr.Out.URL.Host != poolHost("abc", envdPort) {
		t.Errorf("to %s", pr.Out.URL)
	}
	in.Header.Set("Authorization", "Bearer the-api-key")
	pr = &httputil.ProxyRequest{In: in, Out: in.Clone(in.Context())}
	pr.Out.URL = &url.URL{}
	rewrite(pr)
	if a := pr.Out.Header.Get("Authorization"); a != "" {
		t.Errorf("a bearer token reached the sandbox: %q", a)
	}
}

// allowlist is the part of runs.Service network() asks.
type allowlist struct {
	Runs
	patterns []string
}

func (a allowlist) Allowlist(context.Context) egress.Patterns {
	ps, _ := egress.ParsePatterns(a.patterns)
	return ps
}

var _ Runs = (*runs.Service)(nil)

// TestNetwork: internet access is the client's allowlist, never more;
// allowOut adds names; denyOut takes everything or is refused.
func TestNetwork(t *testing.T) {
	s := &Service{runs: allowlist{patterns: []string{"pypi.org", "*.github.com"}}}
	no, yes := false, true
	for _, c := range []struct {
		name    string
		body    newSandboxJSON
		domains string
		private bool
		err     string
	}{
		{name: "default: the allowlist", domains: "pypi.org,*.github.com"},
		{name: "no internet", body: newSandboxJSON{AllowInternetAccess: &no}},
		{name: "internet", body: newSandboxJSON{AllowInternetAccess: &yes}, domains: "pypi.org,*.github.com"},
		{name: "deny all, allow one", body: newSandboxJSON{Network: &networkJSON{DenyOut: []string{"0.0.0.0/0"}, AllowOut: []string{"PyPI.org"}}}, domains: "pypi.org"},
		{name: "no internet, allow one", body: newSandboxJSON{AllowInternetAccess: &no, Network: &networkJSON{AllowOut: []string{"example.com"}}}, domains: "example.com"},
		{name: "private traffic", body: newSandboxJSON{AllowInternetAccess: &no, Network: &networkJSON{AllowPublicTraffic: &no}}, private: true},
		{name: "deny a range", body: newSandboxJSON{Network: &networkJSON{DenyOut: []string{"10.0.0.0/8"}}}, err: runbox.EUnsupported},
		{name: "allow an address", body: newSandboxJSON{Network: &networkJSON{AllowOut: []string{"8.8.8.8"}}}, err: runbox.EUnsupported},
		{name: "allow a range", body: newSandboxJSON{Network: &networkJSON{AllowOut: []string{"8.8.8.0/24"}}}, err: runbox.EUnsupported},
		{name: "rules", body: newSandboxJSON{Network: &networkJSON{Rules: map[string]any{"x.com": nil}}}, err: runbox.EUnsupported},
	} {
		n, private, err := s.network(context.Background(), c.body)
		if runbox.ErrorCode(err) != c.err && !(c.err == "" && err == nil) {
			t.Errorf("%s: %v", c.name, err)
			continue
		}
		got := ""
		if n != nil {
			got = strings.Join(n.AllowedDomains, ",")
		}
		if err == nil && (got != c.domains || private != c.private) {
			t.Errorf("%s: %q private %v, want %q %v", c.name, got, private, c.domains, c.private)
		}
	}
}

// TestMetadataQuery: a listing's filter, as the SDK encodes it.
func TestMetadataQuery(t *testing.T) {
	q := url.Values{}
	q.Set(url.QueryEscape("sandbox test id"), url.QueryEscape("a&b=c"))
	md, err := metadataQuery(q.Encode())
	if err != nil || len(md) != 1 || md["sandbox test id"] != "a&b=c" {
		t.Errorf("%v %v", md, err)
	}
	if _, err := metadataQuery("%zz"); runbox.ErrorCode(err) != runbox.EInvalid {
		t.Errorf("a bad query: %v", err)
	}
}

// TestTemplates: E2B's templates and runners' languages have a runner and
// a launcher; anything else is not found.
func TestTemplates(t *testing.T) {
	for _, c := range []struct {
		id, lang    string
		interpreter bool
	}{{"base", "shell", false}, {"", "shell", false}, {"code-interpreter-v1", "shell", true}, {"python", "python", false}, {"go", "go", false}} {
		tpl, ok := templateOf(c.id)
		if !ok || tpl.language != c.lang || tpl.interpreter != c.interpreter || launchers[tpl.language] == "" {
			t.Errorf("%q: %+v %v", c.id, tpl, ok)
		}
	}
	if _, ok := templateOf("mcp-gateway"); ok {
		t.Error("an unknown template")
	}
	if runbox.ErrorCode(templateError("x")) != runbox.ENotFound {
		t.Error("templateError")
	}
}
