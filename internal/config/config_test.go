package config

import (
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
		c.QuotaBytes != 1<<30 || c.FileURLTTL != 24*time.Hour || c.APIToken != "" || c.RedisURL != "" {
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
	if c.APIToken != "single-token" || c.APITokens != "alice:alice-token, bob:bob-token" {
		t.Errorf("tokens %q %q, as given", c.APIToken, c.APITokens)
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
		{"REDIS_URL", "http://x"},
		{"PUBLIC_BASE_URL", "ftp://x"},
		{"FILE_SECRET", "tooshort"},
		{"LOG_LEVEL", "chatty"},
		{"LOG_FORMAT", "xml"},
		{"EXECUTOR_ID", "a/b"},
		{"EXECUTOR_CONCURRENCY", "many"},
		{"MCP_TRUSTED_PROXIES", "proxy.internal"},
		{"MCP_UNAUTHORIZED_PER_MINUTE", "0"},
		{"AUDIT_MAX_REDIS_ENTRIES", "-1"},
		{"FILE_STORE", "/srv/files"},
		{"FILE_STORE", "s3://"},
		{"FILE_STORE", "s3://Upper_Case"},
		{"FILE_STORE", "s3://user:pw@bucket"},
		{"FILE_STORE", "gs://bucket"},
		{"SANDBOX_EGRESS_MAX_BYTES", "lots"},
		{"SANDBOX_EGRESS_MAX_CONNECTIONS", "0"},
		{"SANDBOX_EGRESS_IDLE_TIMEOUT", "never"},
		{"PREVIEW_WS_IDLE", "forever"},
		{"PREVIEW_MAX_STREAMS", "0"},
		{"PREVIEW_MAX_STREAMS_PER_CONVERSATION", "-1"},
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

// TestFloodSettings: the bounds of issue 32 and the proxies whose
// X-Forwarded-For is believed.
func TestFloodSettings(t *testing.T) {
	c, err := FromEnv(env(nil))
	if err != nil {
		t.Fatal(err)
	}
	if c.UnauthorizedPerMinute != 60 || c.AuditMaxRedisEntries != 100000 || c.TrustedProxies != nil {
		t.Errorf("defaults: %d, %d, %v", c.UnauthorizedPerMinute, c.AuditMaxRedisEntries, c.TrustedProxies)
	}
	c, err = FromEnv(env(map[string]string{"MCP_TRUSTED_PROXIES": "10.0.0.5, 10.1.2.3/8,::ffff:192.0.2.1,fd00::/64",
		"MCP_UNAUTHORIZED_PER_MINUTE": "5", "AUDIT_MAX_REDIS_ENTRIES": "0"}))
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, p := range c.TrustedProxies {
		got = append(got, p.String())
	}
	if want := []string{"10.0.0.5/32", "10.0.0.0/8", "192.0.2.1/32", "fd00::/64"}; !slices.Equal(got, want) {
		t.Errorf("trusted proxies %q, want %q", got, want)
	}
	if c.UnauthorizedPerMinute != 5 || c.AuditMaxRedisEntries != 0 {
		t.Errorf("values: %d, %d", c.UnauthorizedPerMinute, c.AuditMaxRedisEntries)
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

// TestPreviewStreams: the bounds of upgraded preview streams.
func TestPreviewStreams(t *testing.T) {
	c, err := FromEnv(env(nil))
	if err != nil {
		t.Fatal(err)
	}
	if c.PreviewStreamIdle != 10*time.Minute || c.PreviewMaxStreams != 1000 || c.PreviewMaxStreamsPerConversation != 32 {
		t.Errorf("defaults %v %d %d", c.PreviewStreamIdle, c.PreviewMaxStreams, c.PreviewMaxStreamsPerConversation)
	}
	c, err = FromEnv(env(map[string]string{"PREVIEW_WS_IDLE": "30s", "PREVIEW_MAX_STREAMS": "10", "PREVIEW_MAX_STREAMS_PER_CONVERSATION": "2"}))
	if err != nil || c.PreviewStreamIdle != 30*time.Second || c.PreviewMaxStreams != 10 || c.PreviewMaxStreamsPerConversation != 2 {
		t.Errorf("values %v %d %d, %v", c.PreviewStreamIdle, c.PreviewMaxStreams, c.PreviewMaxStreamsPerConversation, err)
	}
}

// TestGroups: each group of settings FromEnv reads, by default and as
// given, where no test above covers it.
func TestGroups(t *testing.T) {
	tests := []struct {
		group string
		env   map[string]string
		ok    func(c *Config) bool
	}{
		{"files", nil, func(c *Config) bool {
			return c.MaxUpload == 50<<20 && c.MaxRead == 10<<20 && c.QuotaFiles == 100000 && c.QuotaMode == "auto" &&
				c.FileRetention == 0 && c.FileSecret == nil
		}},
		{"files", map[string]string{"SANDBOX_QUOTA_MODE": "Walk", "SANDBOX_QUOTA_FILES": "10", "SANDBOX_FILE_RETENTION": "48h",
			"FILE_SECRET": "0123456789abcdef"}, func(c *Config) bool {
			return c.QuotaMode == "walk" && c.QuotaFiles == 10 && c.FileRetention == 48*time.Hour && string(c.FileSecret) == "0123456789abcdef"
		}},
		{"server", nil, func(c *Config) bool {
			return c.BodyBudget == 256<<20 && c.MetricsToken == "" && c.AllowedOrigins == nil
		}},
		{"server", map[string]string{"RUNBOX_PORT": "9000", "METRICS_TOKEN": " m-token ", "REDIS_URL": "redis://127.0.0.1:6379/1"},
			func(c *Config) bool {
				return c.PublicBaseURL == "http://localhost:9000" && c.MetricsToken == "m-token" && c.RedisURL == "redis://127.0.0.1:6379/1"
			}},
		{"sandbox", nil, func(c *Config) bool {
			return c.MaxCode == 102400 && c.MaxInlineImages == 4 && c.MaxInlineImageBytes == 1<<20 && c.SessionTTL == 30*time.Minute &&
				c.MaxQueuedPerConversation == 16 && c.MaxSessions == 0 && c.MaxWarm == "32" && c.Pool == "1,python=2" &&
				c.Runtime == "" && c.ServerTTL == time.Hour && c.ProjectTTL == time.Hour &&
				c.Engine == "docker" && c.Kubernetes == Kubernetes{Namespace: "runbox-sandboxes"}
		}},
		{"sandbox", map[string]string{"SANDBOX_ENGINE": "kubernetes", "KUBECONFIG": "/k/config", "SANDBOX_K8S_NAMESPACE": "boxes",
			"SANDBOX_K8S_RUNTIME_CLASS": "runsc", "SANDBOX_RUNNERS_FILE": "/etc/runbox/runners.json"}, func(c *Config) bool {
			return c.Engine == "kubernetes" && c.Kubernetes == Kubernetes{Kubeconfig: "/k/config", Namespace: "boxes", RuntimeClass: "runsc",
				RunnersFile: "/etc/runbox/runners.json"}
		}},
		{"sandbox", map[string]string{"SANDBOX_RUNTIME": "runsc", "SANDBOX_MAX_SESSIONS": "3", "SANDBOX_POOL": "0",
			"SANDBOX_SERVER_TTL": "5m", "SANDBOX_MAX_INLINE_IMAGES": "0"}, func(c *Config) bool {
			return c.Runtime == "runsc" && c.MaxSessions == 3 && c.Pool == "0" && c.ServerTTL == 5*time.Minute && c.MaxInlineImages == 0
		}},
		{"commands", nil, func(c *Config) bool {
			return c.CommandTimeout == 300*time.Second && c.MaxPerSession == 5 && c.MaxConcurrent == 10
		}},
		{"commands", map[string]string{"SANDBOX_TIMEOUT": "20", "SANDBOX_MAX_PER_SESSION": "2", "SANDBOX_MAX_CONCURRENT": "0"},
			func(c *Config) bool {
				return c.CommandTimeout == 20*time.Second && c.MaxPerSession == 2 && c.MaxConcurrent == 0
			}},
		{"executor", nil, func(c *Config) bool {
			return c.MaxDetached == 32 && c.PollInterval == DefaultPollInterval && c.MetricsAddr == "" &&
				c.ShutdownGrace == 30*time.Second && c.ExecutorID != "" && c.RunnerTag == "latest" &&
				c.LinkAddr == "127.0.0.1:0" && c.LinkAdvertise == ""
		}},
		{"executor", map[string]string{"EXECUTOR_CONCURRENCY": "3", "EXECUTOR_ID": "exec-1", "RUNNER_TAG": "v2",
			"EXECUTOR_POLL_INTERVAL": "250ms", "EXECUTOR_LINK_ADVERTISE": "10.0.0.2:7000"}, func(c *Config) bool {
			return c.Concurrency == 3 && c.ExecutorID == "exec-1" && c.RunnerTag == "v2" &&
				c.PollInterval == 250*time.Millisecond && c.LinkAdvertise == "10.0.0.2:7000"
		}},
		{"audit", nil, func(c *Config) bool {
			return c.AuditRetention == 2160*time.Hour && c.AuditKey == nil
		}},
		{"audit", map[string]string{"AUDIT_RETENTION": "24h", "AUDIT_KEY": "audit-key-0123456789"}, func(c *Config) bool {
			return c.AuditRetention == 24*time.Hour && string(c.AuditKey) == "audit-key-0123456789"
		}},
		{"previews", nil, func(c *Config) bool {
			return c.PreviewScheme == "http" && c.PreviewDomain == "localhost:8080" && c.PreviewURLTTL == time.Hour &&
				c.PreviewMaxRequest == 10<<20 && c.PreviewMaxResponse == 100<<20 && c.PreviewRate == 100
		}},
		{"previews", map[string]string{"PUBLIC_BASE_URL": "https://runbox.example", "PREVIEW_RATE": "5"}, func(c *Config) bool {
			return c.PreviewScheme == "https" && c.PreviewDomain == "localhost" && c.PreviewRate == 5
		}},
		{"previews", map[string]string{"PREVIEW_BASE_DOMAIN": "preview.example"}, func(c *Config) bool {
			return c.PreviewDomain == "preview.example"
		}},
		{"parts' own settings, as given", map[string]string{"CLIENTS_FILE": " /etc/runbox/clients.yaml ",
			"SANDBOX_EGRESS_ALLOW": "pypi.org, *.pythonhosted.org", "SANDBOX_EGRESS_HOSTS": "pypi.internal=10.0.0.5:8080",
			"SANDBOX_EGRESS_DENY_CIDRS": "10.1.0.0/16", "SANDBOX_SECRETS_FILE": "/etc/runbox/secrets.yaml",
			"WEBHOOK_ALLOW": "hooks.example.com", "WEBHOOK_HOSTS": "recv.test=127.0.0.1:9999",
			"GIT_REPOS_FILE": "/etc/runbox/repos.yaml", "GIT_API_URL": "https://git.example/"}, func(c *Config) bool {
			return c.ClientsFile == "/etc/runbox/clients.yaml" && c.Egress.Allow == "pypi.org, *.pythonhosted.org" &&
				c.Egress.Hosts == "pypi.internal=10.0.0.5:8080" && c.Egress.Deny == "10.1.0.0/16" &&
				c.Egress.SecretsFile == "/etc/runbox/secrets.yaml" && c.Webhooks.Allow == "hooks.example.com" &&
				c.Webhooks.Hosts == "recv.test=127.0.0.1:9999" && c.GitReposFile == "/etc/runbox/repos.yaml" &&
				c.GitAPIURL == "https://git.example/"
		}},
		{"logs", nil, func(c *Config) bool {
			return c.LogLevel == "info" && c.LogFormat == "text" && c.LogFile == ""
		}},
		{"logs", map[string]string{"LOG_LEVEL": "DEBUG", "LOG_FORMAT": "json", "SANDBOX_LOG_FILE": "/var/log/runbox.log"},
			func(c *Config) bool {
				return c.LogLevel == "debug" && c.LogFormat == "json" && c.LogFile == "/var/log/runbox.log"
			}},
	}
	for _, tt := range tests {
		c, err := FromEnv(env(tt.env))
		if err != nil {
			t.Errorf("%s %v: %v", tt.group, tt.env, err)
			continue
		}
		if !tt.ok(c) {
			t.Errorf("%s %v: %+v", tt.group, tt.env, c)
		}
	}
}

// TestGroupErrors: the bad values of the groups TestErrorsNameTheVariable
// does not reach, each refused with its message.
func TestGroupErrors(t *testing.T) {
	tests := []struct {
		env  map[string]string
		want string
	}{
		{map[string]string{"SANDBOX_QUOTA_MODE": "quota"}, `config: SANDBOX_QUOTA_MODE must be one of auto, loop, walk (got "quota")`},
		{map[string]string{"SANDBOX_FILE_RETENTION": "0"}, `config: SANDBOX_FILE_RETENTION must be a positive duration such as 30s or 24h (got "0")`},
		{map[string]string{"MCP_HTTP_BODY_BUDGET": "1m"}, "config: MCP_HTTP_BODY_BUDGET must hold at least one largest MCP message"},
		{map[string]string{"SANDBOX_RUNTIME": "run sc"}, "config: SANDBOX_RUNTIME must name an OCI runtime the Docker Engine knows, such as runsc"},
		{map[string]string{"SANDBOX_ENGINE": "k8s"}, `config: SANDBOX_ENGINE must be one of docker, kubernetes (got "k8s")`},
		{map[string]string{"SANDBOX_RUNNERS_FILE": "/etc/runbox/runners.json"}, "config: SANDBOX_RUNNERS_FILE is read by the Kubernetes engine alone (SANDBOX_ENGINE=kubernetes)"},
		{map[string]string{"SANDBOX_K8S_NAMESPACE": "Sandboxes"}, "config: SANDBOX_K8S_NAMESPACE must be a Kubernetes namespace's name (lower-case letters, digits and '-', at most 63)"},
		{map[string]string{"SANDBOX_TIMEOUT": "0"}, `config: SANDBOX_TIMEOUT must be a whole number of at least 1 (got "0")`},
		{map[string]string{"SANDBOX_MAX_CONCURRENT": "-1"}, `config: SANDBOX_MAX_CONCURRENT must be a whole number of at least 0 (got "-1")`},
		{map[string]string{"EXECUTOR_POLL_INTERVAL": "often"}, `config: EXECUTOR_POLL_INTERVAL must be a positive duration such as 30s or 24h (got "often")`},
		{map[string]string{"AUDIT_KEY": "short"}, "config: AUDIT_KEY must be at least 16 characters"},
		{map[string]string{"AUDIT_RETENTION": "-1h"}, `config: AUDIT_RETENTION must be a positive duration such as 30s or 24h (got "-1h")`},
		{map[string]string{"PREVIEW_RATE": "0"}, `config: PREVIEW_RATE must be a whole number of at least 1 (got "0")`},
		{map[string]string{"PREVIEW_MAX_RESPONSE_BYTES": "big"}, `config: PREVIEW_MAX_RESPONSE_BYTES must be a size such as 512m or 1g (got "big")`},
		{map[string]string{"GIT_API_URL": "https://git.example/api/v1"}, "config: GIT_API_URL is set without GIT_REPOS_FILE, which names the repositories it serves"},
		{map[string]string{"SANDBOX_LOG_FILE": "", "LOG_FORMAT": "yaml"}, `config: LOG_FORMAT must be one of text, json (got "yaml")`},
	}
	for _, tt := range tests {
		_, err := FromEnv(env(tt.env))
		if err == nil || !strings.HasPrefix(err.Error(), tt.want) {
			t.Errorf("%v: %v, want %q", tt.env, err, tt.want)
		}
	}
}
