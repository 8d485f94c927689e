package app

import (
	"crypto/sha256"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/runbox-dev/runbox/internal/config"
)

// The parts' own settings, which config keeps as given and Load has each
// part read: their values, and a bad one refused at start with one line
// naming its variable.

func env(kv map[string]string) func(string) string {
	return func(k string) string { return kv[k] }
}

func TestLoadClients(t *testing.T) {
	c, err := Load(env(map[string]string{"MCP_API_TOKEN": "single-token", "MCP_API_TOKENS": "alice:alice-token, bob:bob-token"}))
	if err != nil {
		t.Fatal(err)
	}
	for tok, name := range map[string]string{"single-token": "default", "alice-token": "alice", "bob-token": "bob"} {
		if c.Clients[sha256.Sum256([]byte(tok))].Name != name {
			t.Errorf("token of %s: %+v", name, c.Clients)
		}
	}
	if c, err := Load(env(nil)); err != nil || len(c.Clients) != 0 {
		t.Errorf("no token: %v, %v", c.Clients, err)
	}
}

func TestLoadErrorsNameTheVariable(t *testing.T) {
	tests := []struct{ name, value string }{
		{"MCP_API_TOKENS", "nocolon"},
		{"MCP_API_TOKEN", "short"},
		{"SANDBOX_EGRESS_ALLOW", "pypi.org,*"},
		{"SANDBOX_EGRESS_ALLOW", "10.0.0.1"},
		{"SANDBOX_EGRESS_HOSTS", "pypi.internal"},
		{"SANDBOX_EGRESS_HOSTS", "pypi.internal=mirror.example"},
		{"SANDBOX_EGRESS_DENY_CIDRS", "203.0.113.0/33"},
		{"SANDBOX_EGRESS_DENY_CIDRS", "my-host"},
		{"GIT_REPOS_FILE", "/nonexistent/repos.yaml"},
		// config's own, through Load too.
		{"SANDBOX_MEMORY_LIMIT", "lots"},
	}
	for _, tt := range tests {
		_, err := Load(env(map[string]string{tt.name: tt.value}))
		if err == nil || !strings.Contains(err.Error(), tt.name) || strings.Contains(err.Error(), "\n") {
			t.Errorf("%s=%q: error %v, want one line naming it", tt.name, tt.value, err)
		}
	}
}

// TestLoadGit: the repositories' file names the clients tokens give (the
// client "default" when none does).
func TestLoadGit(t *testing.T) {
	const token = "tok_0123456789abcdef0123"
	file := filepath.Join(t.TempDir(), "repos.yaml")
	if err := os.WriteFile(file, []byte("repos:\n  r: {forge: gitea, url: \"http://127.0.0.1:3000/o/r.git\", token: "+token+
		", clients: [alice]}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	c, err := Load(env(map[string]string{"MCP_API_TOKENS": "alice:alice-token", "GIT_REPOS_FILE": file}))
	if err != nil || c.Git == nil || c.Git.Repos["r"].Owner != "o" {
		t.Fatalf("repos %+v, %v", c, err)
	}
	if c, err := Load(env(nil)); err != nil || c.Git != nil {
		t.Errorf("without the file: %v, %v", c.Git, err)
	}
	_, err = Load(env(map[string]string{"GIT_REPOS_FILE": file}))
	if err == nil || !strings.Contains(err.Error(), `GIT_REPOS_FILE: repo "r": clients: no token belongs to a client "alice"`) ||
		strings.Contains(err.Error(), token) {
		t.Errorf("a client no token gives: %v", err)
	}
}

func TestLoadEgress(t *testing.T) {
	c, err := Load(env(nil))
	if err != nil {
		t.Fatal(err)
	}
	e, p := c.Egress, c.EgressPolicy
	if len(p.Allow) != 0 || len(p.Hosts) != 0 || e.MaxBytes != 512<<20 || e.MaxConnections != 256 ||
		e.ConnectTimeout != 10*time.Second || e.IdleTimeout != time.Minute ||
		c.PipIndexURL != config.DefaultPipIndexURL || c.NPMRegistry != config.DefaultNPMRegistry {
		t.Errorf("defaults %+v %q %q", e, c.PipIndexURL, c.NPMRegistry)
	}
	c, err = Load(env(map[string]string{
		"SANDBOX_EGRESS_ALLOW":           "pypi.org, *.pythonhosted.org",
		"SANDBOX_EGRESS_HOSTS":           "pypi.internal=10.0.0.5:8080",
		"SANDBOX_EGRESS_MAX_BYTES":       "1m",
		"SANDBOX_EGRESS_MAX_CONNECTIONS": "8",
		"SANDBOX_PIP_INDEX_URL":          "http://pypi.internal:8080/simple",
	}))
	if err != nil {
		t.Fatal(err)
	}
	e, p = c.Egress, c.EgressPolicy
	if strings.Join(p.Allow.Strings(), ",") != "pypi.org,*.pythonhosted.org" || p.Hosts["pypi.internal"].Port != 8080 ||
		e.MaxBytes != 1<<20 || e.MaxConnections != 8 || c.PipIndexURL != "http://pypi.internal:8080/simple" {
		t.Errorf("values %+v %q", e, c.PipIndexURL)
	}
	// Ranges the operator refuses; a mapping into one is a contradiction.
	c, err = Load(env(map[string]string{"SANDBOX_EGRESS_DENY_CIDRS": "203.0.113.7, 198.51.100.0/24,2001:db8::/32"}))
	if err != nil || len(c.EgressPolicy.Deny) != 3 || !c.EgressPolicy.Deny.Contains(netip.MustParseAddr("203.0.113.7")) ||
		c.EgressPolicy.Deny.Contains(netip.MustParseAddr("203.0.113.8")) {
		t.Errorf("deny %v, %v", c.EgressPolicy.Deny, err)
	}
	_, err = Load(env(map[string]string{"SANDBOX_EGRESS_DENY_CIDRS": "10.0.0.0/8", "SANDBOX_EGRESS_HOSTS": "pypi.internal=10.0.0.5"}))
	if err == nil || !strings.Contains(err.Error(), "pypi.internal") {
		t.Errorf("a mapping into a refused range: %v", err)
	}
}

func TestLoadSecrets(t *testing.T) {
	dir := t.TempDir()
	write := func(name, content string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	const value = "sk-live-0123456789"
	secrets := write("secrets.yaml", "secrets:\n  openai: {value: "+value+", domains: [api.openai.com]}\n  github: {value: ghp_0123456789, domains: [api.github.com]}\n")
	tiers := write("clients.yaml", "tiers:\n  narrow: {secrets: [github]}\n  none: {secrets: []}\nclients:\n"+
		"  - {name: a, token: token-a-0123456789, tier: narrow}\n  - {name: b, token: token-b-0123456789, tier: none}\n"+
		"  - {name: c, token: token-c-0123456789}\n")
	c, err := Load(env(map[string]string{"SANDBOX_SECRETS_FILE": secrets, "CLIENTS_FILE": tiers}))
	if err != nil {
		t.Fatal(err)
	}
	if strings.Join(c.EgressPolicy.Secrets.Names(), ",") != "github,openai" || !c.EgressReachable() || !slices.Contains(c.Secrets, value) {
		t.Errorf("secrets %v, reachable %v", c.EgressPolicy.Secrets.Names(), c.EgressReachable())
	}
	byName := map[string][]string{}
	for _, cl := range c.Clients {
		byName[cl.Name] = cl.Tier.Secrets
	}
	if !slices.Equal(byName["a"], []string{"github"}) || byName["b"] == nil || len(byName["b"]) != 0 || byName["c"] != nil {
		t.Errorf("tiers' secrets %q", byName)
	}
	ca := write("ca.pem", "not a certificate")
	for _, tt := range []struct {
		env  map[string]string
		want string
	}{
		{map[string]string{"SANDBOX_SECRETS_FILE": write("bad.yaml", "secrets: {x: {value: "+value+"}}")}, "SANDBOX_SECRETS_FILE secret x: domains"},
		{map[string]string{"SANDBOX_SECRETS_FILE": filepath.Join(dir, "missing")}, "SANDBOX_SECRETS_FILE"},
		{map[string]string{"CLIENTS_FILE": tiers}, `tier narrow: secrets names "github", which SANDBOX_SECRETS_FILE does not`},
		{map[string]string{"SANDBOX_EGRESS_CA_FILE": ca}, "SANDBOX_EGRESS_CA_FILE holds no PEM certificate"},
	} {
		_, err := Load(env(tt.env))
		if err == nil || !strings.Contains(err.Error(), tt.want) || strings.Contains(err.Error(), value) {
			t.Errorf("%v: %v, want %q", tt.env, err, tt.want)
		}
	}
}

func TestLoadWebhooks(t *testing.T) {
	c, err := Load(env(nil))
	if err != nil {
		t.Fatal(err)
	}
	if w, p := c.Webhooks, c.WebhookPolicy; len(w.Secret) != 0 || len(p.Allow) != 0 || len(p.Hosts) != 0 || w.Backoff != 5*time.Second || w.RetryFor != 24*time.Hour ||
		w.PerClient != 4 {
		t.Errorf("defaults %+v", w)
	}
	const s1, s2 = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", "whsec_dGhlLW5ldy1zZWNyZXQtb2YtdGhpcnR5LXR3by1ieXQ="
	c, err = Load(env(map[string]string{
		"WEBHOOK_SECRET": s2 + ", " + s1, "WEBHOOK_ALLOW": "hooks.example.com,*.example.org",
		"WEBHOOK_HOSTS": "recv.test=127.0.0.1:9999", "WEBHOOK_BACKOFF": "1s", "WEBHOOK_RETRY_FOR": "1h",
		"WEBHOOK_CONCURRENCY_PER_CLIENT": "2",
	}))
	if err != nil {
		t.Fatal(err)
	}
	w, p := c.Webhooks, c.WebhookPolicy
	if !slices.Equal(w.Secret, []string{s2, s1}) || strings.Join(p.Allow.Strings(), ",") != "hooks.example.com,*.example.org" ||
		p.Hosts["recv.test"].Port != 9999 || w.Backoff != time.Second || w.RetryFor != time.Hour || w.PerClient != 2 || !slices.Contains(c.Secrets, s2) || !slices.Contains(c.Secrets, s1) {
		t.Errorf("values %+v", w)
	}
	for name, v := range map[string]string{"WEBHOOK_SECRET": "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", "WEBHOOK_ALLOW": "127.0.0.1",
		"WEBHOOK_HOSTS": "recv.test", "WEBHOOK_BACKOFF": "soon", "WEBHOOK_RETRY_FOR": "-1h",
		"WEBHOOK_CONCURRENCY_PER_CLIENT": "0"} {
		_, err := Load(env(map[string]string{name: v}))
		if err == nil || !strings.Contains(err.Error(), name) || strings.Contains(err.Error(), "MfKQ9r8") {
			t.Errorf("%s=%s: %v", name, v, err)
		}
	}
}

func TestLoadWebhookHostsOutsideDenyRanges(t *testing.T) {
	_, err := Load(env(map[string]string{"WEBHOOK_HOSTS": "recv.test=10.0.0.5:8080", "SANDBOX_EGRESS_DENY_CIDRS": "10.0.0.0/8"}))
	if err == nil || !strings.Contains(err.Error(), "WEBHOOK_HOSTS maps recv.test") {
		t.Fatalf("a mapping into a denied range: %v", err)
	}
}
