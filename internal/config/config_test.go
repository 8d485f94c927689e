package config

import (
	"crypto/sha256"
	"slices"
	"strings"
	"testing"
	"time"
)

func env(kv map[string]string) func(string) string {
	return func(k string) string { return kv[k] }
}

func TestDefaults(t *testing.T) {
	c, err := FromEnv(env(nil))
	if err != nil {
		t.Fatal(err)
	}
	if c.HTTPAddr != ":8080" || c.PublicBaseURL != "http://localhost:8080" || c.MemoryLimit != 512<<20 ||
		c.NanoCPUs != 1e9 || c.PidsLimit != 128 || c.ExecTimeout != time.Minute || c.MaxOutput != 102400 ||
		c.QuotaBytes != 1<<30 || c.FileURLTTL != 24*time.Hour || len(c.Clients) != 0 || c.RedisURL != "" {
		t.Errorf("defaults %+v", c)
	}
	if !strings.HasSuffix(c.SandboxRoot, "/var/sandboxes") || !strings.HasPrefix(c.SandboxRoot, "/") {
		t.Errorf("sandbox root %q is not absolute", c.SandboxRoot)
	}
}

func TestValues(t *testing.T) {
	c, err := FromEnv(env(map[string]string{
		"MCP_HTTP_ADDR":        "127.0.0.1:9090",
		"MCP_API_TOKEN":        "single-token",
		"MCP_API_TOKENS":       "alice:alice-token, bob:bob-token",
		"SANDBOX_MEMORY_LIMIT": "1g",
		"SANDBOX_CPU_LIMIT":    "0.5",
		"SANDBOX_EXEC_TIMEOUT": "90s",
	}))
	if err != nil {
		t.Fatal(err)
	}
	if c.PublicBaseURL != "http://localhost:9090" {
		t.Errorf("base URL %q does not follow the port", c.PublicBaseURL)
	}
	for tok, name := range map[string]string{"single-token": "default", "alice-token": "alice", "bob-token": "bob"} {
		if c.Clients[sha256.Sum256([]byte(tok))].Name != name {
			t.Errorf("token of %s: %+v", name, c.Clients)
		}
	}
	if c.MemoryLimit != 1<<30 || c.NanoCPUs != 5e8 || c.MaxTimeoutSeconds() != 90 {
		t.Errorf("limits %+v", c)
	}
}

func TestErrorsNameTheVariable(t *testing.T) {
	tests := []struct{ name, value string }{
		{"SANDBOX_MEMORY_LIMIT", "lots"},
		{"SANDBOX_MEMORY_LIMIT", "1k"},
		{"SANDBOX_CPU_LIMIT", "-1"},
		{"SANDBOX_PIDS_LIMIT", "0"},
		{"SANDBOX_EXEC_TIMEOUT", "soon"},
		{"SANDBOX_EXEC_TIMEOUT", "100ms"},
		{"FILE_URL_TTL", "-1h"},
		{"MCP_API_TOKENS", "nocolon"},
		{"MCP_API_TOKEN", "short"},
		{"REDIS_URL", "http://x"},
		{"PUBLIC_BASE_URL", "ftp://x"},
		{"FILE_SECRET", "tooshort"},
		{"LOG_LEVEL", "chatty"},
		{"LOG_FORMAT", "xml"},
		{"EXECUTOR_ID", "a/b"},
		{"EXECUTOR_CONCURRENCY", "many"},
		{"FILE_STORE", "/srv/files"},
		{"FILE_STORE", "s3://"},
		{"FILE_STORE", "s3://Upper_Case"},
		{"FILE_STORE", "s3://user:pw@bucket"},
		{"FILE_STORE", "gs://bucket"},
		{"SANDBOX_EGRESS_ALLOW", "pypi.org,*"},
		{"SANDBOX_EGRESS_ALLOW", "10.0.0.1"},
		{"SANDBOX_EGRESS_HOSTS", "pypi.internal"},
		{"SANDBOX_EGRESS_HOSTS", "pypi.internal=mirror.example"},
		{"SANDBOX_EGRESS_MAX_BYTES", "lots"},
		{"SANDBOX_EGRESS_MAX_CONNECTIONS", "0"},
		{"SANDBOX_EGRESS_IDLE_TIMEOUT", "never"},
		{"SANDBOX_PIP_INDEX_URL", "ftp://pypi.org/simple"},
		{"SANDBOX_NPM_REGISTRY", "https://user:pw@registry.example/"},
		{"MCP_ALLOWED_ORIGINS", "app.example.com"},
		{"MCP_ALLOWED_ORIGINS", "https://a.example,https://b.example/path"},
		{"MCP_ALLOWED_ORIGINS", "*"},
	}
	for _, tt := range tests {
		_, err := FromEnv(env(map[string]string{tt.name: tt.value}))
		if err == nil || !strings.Contains(err.Error(), tt.name) || strings.Contains(err.Error(), "\n") {
			t.Errorf("%s=%q: error %v, want one line naming it", tt.name, tt.value, err)
		}
	}
}

// TestOrigins: the server's own origin is PUBLIC_BASE_URL's, path dropped;
// MCP_ALLOWED_ORIGINS adds others.
func TestOrigins(t *testing.T) {
	c, err := FromEnv(env(map[string]string{"PUBLIC_BASE_URL": "https://runbox.example:8443/base/",
		"MCP_ALLOWED_ORIGINS": " https://app.example.com, http://localhost:3000 ,"}))
	if err != nil {
		t.Fatal(err)
	}
	if c.Origin() != "https://runbox.example:8443" {
		t.Errorf("own origin %q", c.Origin())
	}
	if want := []string{"https://app.example.com", "http://localhost:3000"}; !slices.Equal(c.AllowedOrigins, want) {
		t.Errorf("allowed origins %q, want %q", c.AllowedOrigins, want)
	}
}

func TestFileStore(t *testing.T) {
	tests := []struct {
		env  map[string]string
		want *S3
	}{
		{nil, nil},
		{map[string]string{"FILE_STORE": "s3://runbox-files"},
			&S3{Bucket: "runbox-files", Region: "us-east-1"}},
		{map[string]string{"FILE_STORE": "s3://b.example/a/b/", "AWS_ENDPOINT_URL": "http://127.0.0.1:7070",
			"AWS_ENDPOINT_URL_S3": "http://s3.local:9000", "AWS_REGION": "eu-west-1",
			"AWS_ACCESS_KEY_ID": "K", "AWS_SECRET_ACCESS_KEY": "S", "AWS_SESSION_TOKEN": "T"},
			&S3{Bucket: "b.example", Prefix: "a/b/", Endpoint: "http://s3.local:9000", Region: "eu-west-1",
				AccessKey: "K", SecretKey: "S", SessionToken: "T"}},
	}
	for _, tt := range tests {
		c, err := FromEnv(env(tt.env))
		if err != nil {
			t.Fatal(err)
		}
		if (c.FileStore == nil) != (tt.want == nil) || c.FileStore != nil && *c.FileStore != *tt.want {
			t.Errorf("%v: %+v, want %+v", tt.env, c.FileStore, tt.want)
		}
	}
}

func TestEgress(t *testing.T) {
	c, err := FromEnv(env(nil))
	if err != nil {
		t.Fatal(err)
	}
	e := c.Egress
	if len(e.Allow) != 0 || len(e.Hosts) != 0 || e.MaxBytes != 512<<20 || e.MaxConnections != 256 ||
		e.ConnectTimeout != 10*time.Second || e.IdleTimeout != time.Minute ||
		c.PipIndexURL != DefaultPipIndexURL || c.NPMRegistry != DefaultNPMRegistry {
		t.Errorf("defaults %+v %q %q", e, c.PipIndexURL, c.NPMRegistry)
	}
	c, err = FromEnv(env(map[string]string{
		"SANDBOX_EGRESS_ALLOW":           "pypi.org, *.pythonhosted.org",
		"SANDBOX_EGRESS_HOSTS":           "pypi.internal=10.0.0.5:8080",
		"SANDBOX_EGRESS_MAX_BYTES":       "1m",
		"SANDBOX_EGRESS_MAX_CONNECTIONS": "8",
		"SANDBOX_PIP_INDEX_URL":          "http://pypi.internal:8080/simple",
	}))
	if err != nil {
		t.Fatal(err)
	}
	e = c.Egress
	if strings.Join(e.Allow.Strings(), ",") != "pypi.org,*.pythonhosted.org" || e.Hosts["pypi.internal"].Port != 8080 ||
		e.MaxBytes != 1<<20 || e.MaxConnections != 8 || c.PipIndexURL != "http://pypi.internal:8080/simple" {
		t.Errorf("values %+v %q", e, c.PipIndexURL)
	}
}
