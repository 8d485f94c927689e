package clients

import (
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func digest(tok string) Digest { return sha256.Sum256([]byte(tok)) }

func TestLoad(t *testing.T) {
	hexOf := func(tok string) string { d := digest(tok); return hex.EncodeToString(d[:]) }
	tests := []struct {
		name          string
		token, tokens string
		file          string
		want          map[string]string // token → client/tier
		err           string            // part of the error
	}{
		{name: "single token", token: "secret-default", want: map[string]string{"secret-default": "default/unlimited"}},
		{name: "named tokens with tiers", token: "secret-default", tokens: "alice:secret-alice:free, bob:secret-bob:pro,carol:secret-carol",
			want: map[string]string{"secret-default": "default/unlimited", "secret-alice": "alice/free", "secret-bob": "bob/pro", "secret-carol": "carol/unlimited"}},
		{name: "file with tiers and digests", tokens: "alice:secret-alice:tiny", file: `
tiers:
  tiny: {calls_per_minute: 5, concurrent_runs: 1}
  free: {calls_per_minute: 1}
clients:
  - {name: bob, token_sha256: ` + hexOf("secret-bob") + `, tier: free}
  - {name: carol, token: secret-carol}
`, want: map[string]string{"secret-alice": "alice/tiny", "secret-bob": "bob/free", "secret-carol": "carol/unlimited"}},
		{name: "json file", file: `{"clients": [{"name": "dave", "token": "secret-dave", "tier": "pro"}]}`,
			want: map[string]string{"secret-dave": "dave/pro"}},
		{name: "unknown tier", tokens: "alice:secret-alice:gold", err: `unknown tier "gold"`},
		{name: "token twice", token: "same-token", tokens: "alice:same-token", err: "also the token of client"},
		{name: "token twice across file", tokens: "alice:secret-a", file: "clients: [{name: bob, token_sha256: " + hexOf("secret-a") + "}]", err: "also the token"},
		{name: "default reserved", tokens: "default:secret-x", err: "reserved"},
		{name: "bad name", tokens: "al ice:secret-x", err: "client name must be"},
		{name: "short token", tokens: "alice:short", err: "at least 8"},
		{name: "malformed entry", tokens: "alice", err: "name:token"},
		{name: "bad digest", file: "clients: [{name: bob, token_sha256: abc}]", err: "64 hexadecimal"},
		{name: "both token and digest", file: "clients: [{name: bob, token: secret-bob, token_sha256: " + hexOf("x") + "}]", err: "exactly one"},
		{name: "unknown field", file: "clients: [{name: bob, tokn: secret-bob}]", err: "CLIENTS_FILE"},
		{name: "negative limit", file: "tiers: {x: {calls_per_minute: -1}}", err: "negative"},
		{name: "egress domains", file: "tiers: {net: {egress_domains: [pypi.org, '*.pythonhosted.org']}}\nclients: [{name: eve, token: secret-eve, tier: net}]",
			want: map[string]string{"secret-eve": "eve/net"}},
		{name: "bad egress domain", file: "tiers: {net: {egress_domains: [10.0.0.1]}}", err: "egress_domains"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := ""
			if tt.file != "" {
				path = filepath.Join(t.TempDir(), "clients.yaml")
				os.WriteFile(path, []byte(tt.file), 0o600)
			}
			got, err := Load(tt.token, tt.tokens, path)
			if tt.err != "" {
				if err == nil || !strings.Contains(err.Error(), tt.err) {
					t.Fatalf("err = %v, want one with %q", err, tt.err)
				}
				if strings.Contains(err.Error(), "secret") || strings.Contains(err.Error(), "\n") {
					t.Errorf("error %q shows a token or spans lines", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != len(tt.want) {
				t.Errorf("%d clients, want %d", len(got), len(tt.want))
			}
			for tok, want := range tt.want {
				c, ok := got[digest(tok)]
				if !ok || c.Name+"/"+c.Tier.Name != want {
					t.Errorf("token %s: %+v, want %s", tok, c, want)
				}
			}
		})
	}
	// A file tier replaces the built-in one of its name.
	path := filepath.Join(t.TempDir(), "c.yaml")
	os.WriteFile(path, []byte("tiers: {free: {calls_per_minute: 1}}"), 0o600)
	got, err := Load("", "alice:secret-alice:free", path)
	if err != nil || got[digest("secret-alice")].Tier.CallsPerMinute != 1 {
		t.Errorf("file tier: %+v, %v", got, err)
	}
}

func FuzzLoadTokens(f *testing.F) {
	for _, s := range []string{"alice:secret-alice", "a:b:c,d:e", "alice:secret-alice:pro, bob:secret-bob:free", ":::", "default:xxxxxxxxx"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, tokens string) {
		got, err := Load("", tokens, "")
		if err != nil {
			if strings.Contains(err.Error(), "\n") {
				t.Fatalf("error spans lines: %q", err)
			}
			return
		}
		// Every accepted entry is a client with a known tier under the
		// digest of its token.
		for entry := range strings.SplitSeq(tokens, ",") {
			entry = strings.TrimSpace(entry)
			if entry == "" {
				continue
			}
			parts := strings.Split(entry, ":")
			c, ok := got[digest(parts[1])]
			if !ok || c.Name != parts[0] || c.Tier.Name == "" {
				t.Fatalf("entry %q: %+v, %v", entry, c, ok)
			}
		}
	})
}

func TestLoadWebhooks(t *testing.T) {
	const s1, s2 = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw", "whsec_dGhlLW5ldy1zZWNyZXQtb2YtdGhpcnR5LXR3by1ieXQ="
	load := func(file string) (Clients, error) {
		path := filepath.Join(t.TempDir(), "clients.yaml")
		if err := os.WriteFile(path, []byte(file), 0o600); err != nil {
			t.Fatal(err)
		}
		return Load("", "", path)
	}
	cs, err := load(`
clients:
  - {name: n8n, token: n8n-token-1, webhook_secret: ` + s1 + `, webhook_url: "https://hooks.n8n.example/runbox",
     webhook_domains: [hooks.n8n.example, "*.n8n.example"], webhook_events: [run.started]}
  - {name: n8n, token: n8n-token-2}
  - {name: rotating, token: rotating-token, webhook_secret: [` + s2 + `, ` + s1 + `]}
  - {name: plain, token: plain-token}
`)
	if err != nil {
		t.Fatal(err)
	}
	w := cs.Webhooks()
	if n := w["n8n"]; len(n.Secrets) != 1 || n.URL != "https://hooks.n8n.example/runbox" || len(n.Domains) != 2 || n.Events[0] != "run.started" {
		t.Errorf("n8n: %+v", n)
	}
	if r := w["rotating"]; len(r.Secrets) != 2 || r.Secrets[0] != s2 {
		t.Errorf("rotating: %+v", r)
	}
	if _, ok := w["plain"]; ok || len(w) != 2 {
		t.Errorf("Webhooks() = %+v", w)
	}
	for file, want := range map[string]string{
		`clients: [{name: a, token: a-token-123, webhook_secret: "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"}]`:                                    "webhook_secret",
		`clients: [{name: a, token: a-token-123, webhook_url: "https://x.example/"}]`:                                                     "without webhook_secret",
		`clients: [{name: a, token: a-token-123, webhook_secret: ` + s1 + `, webhook_events: [run.ended]}]`:                               "webhook_events",
		`clients: [{name: a, token: a-token-123, webhook_secret: ` + s1 + `, webhook_domains: ["127.0.0.1"]}]`:                            "webhook_domains",
		`clients: [{name: a, token: a-token-123, webhook_secret: ` + s1 + `}, {name: a, token: a-token-456, webhook_secret: ` + s2 + `}]`: "other webhook settings",
	} {
		_, err := load(file)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v; want an error about %s", file, err, want)
		} else if strings.Contains(err.Error(), "MfKQ9r8") {
			t.Errorf("the error names the secret: %v", err)
		}
	}
}
