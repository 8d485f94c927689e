// Package config reads the service's configuration from the environment, as
// the contract lists it. A bad value is an error naming the variable, so a
// process can fail at start with one clear line.
package config

import (
	"cmp"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/docker/go-units"

	"github.com/runbox-dev/runbox"
	"github.com/runbox-dev/runbox/internal/clients"
	"github.com/runbox-dev/runbox/internal/egress"
)

// Config is every setting of api and executor.
type Config struct {
	HTTPAddr      string
	Clients       clients.Clients // by token digest; empty: api makes a token
	RedisURL      string          // empty: embedded
	SandboxRoot   string          // absolute
	FileSecret    []byte          // empty: load or make one under SandboxRoot
	FileURLTTL    time.Duration
	PublicBaseURL string
	// AllowedOrigins are the web origins, besides PublicBaseURL's, whose
	// requests the api's routes accept (MCP_ALLOWED_ORIGINS).
	AllowedOrigins []string

	MemoryLimit int64 // bytes
	NanoCPUs    int64
	PidsLimit   int64
	ExecTimeout time.Duration
	MaxOutput   int
	MaxCode     int
	MaxUpload   int64
	MaxRead     int64
	// AuditKey signs the audit chain; empty: load or make one under
	// SandboxRoot.
	AuditKey []byte
	// AuditRetention is how long audit entries are kept.
	AuditRetention time.Duration
	// MetricsToken, when set, guards the api's /metrics.
	MetricsToken string
	// BodyBudget bounds the request bodies the api holds in memory at once.
	BodyBudget int64
	QuotaBytes int64
	// QuotaFiles bounds the entries of one conversation in walk mode.
	QuotaFiles int
	SessionTTL time.Duration
	// MaxQueuedPerConversation bounds the runs waiting behind a
	// conversation's running one.
	MaxQueuedPerConversation int
	// QuotaMode is how SANDBOX_QUOTA_BYTES is held: auto, loop or walk.
	QuotaMode string
	// FileRetention, when set, removes conversations unused for longer.
	FileRetention time.Duration
	// MaxInlineImages and MaxInlineImageBytes bound the images a run's
	// result carries as image content.
	MaxInlineImages     int
	MaxInlineImageBytes int64
	Concurrency         int
	// MaxDetached bounds the runs an executor lets run on without a slot
	// (parallel and detached runs).
	MaxDetached int
	// MaxWarm bounds the idle sandboxes an executor keeps for their
	// conversations, per language: "32" or "python=16,bash=8".
	MaxWarm string
	// PollInterval is how often an idle executor asks Redis for work.
	PollInterval time.Duration
	// MetricsAddr, when set, is where a standalone executor serves
	// /metrics.
	MetricsAddr string
	// Pool is how many sandboxes per language an executor keeps started
	// for new conversations: "1,python=2".
	Pool          string
	ShutdownGrace time.Duration
	ExecutorID    string
	// RunnerTag is the tag of the runner images an executor prefers.
	RunnerTag string
	// Runtime is the OCI runtime sandboxes run under (runsc for gVisor);
	// the engine's default if empty.
	Runtime string

	// FileStore is where conversations' files live; nil: the host folder
	// SandboxRoot.
	FileStore *S3

	// PreviewDomain is where previews are served, <capability>.<domain>
	// (PREVIEW_BASE_DOMAIN): "localhost:<port of PUBLIC_BASE_URL>" by
	// default; PreviewScheme is PUBLIC_BASE_URL's.
	PreviewDomain string
	PreviewScheme string
	// PreviewURLTTL is how long a preview URL lives.
	PreviewURLTTL time.Duration
	// PreviewMaxRequest and PreviewMaxResponse bound a proxied request's
	// and response's body (and each direction of a WebSocket);
	// PreviewRate the requests a second to one preview URL.
	PreviewMaxRequest  int64
	PreviewMaxResponse int64
	PreviewRate        int
	// ServerTTL ends a background run (a server) idle this long.
	ServerTTL time.Duration
	// ProjectTTL is how long a project (create_sandbox_for_project) lives.
	ProjectTTL time.Duration
	// LinkAddr is where an executor serves the api's link to its
	// sandboxes; LinkAdvertise, when set, the address the api dials.
	LinkAddr      string
	LinkAdvertise string

	// Secrets are the service's own secrets as given (tokens, keys), which
	// output shown to clients never carries (projects redact them).
	Secrets []string
	// Git is GIT_REPOS_FILE (with GIT_API_URL): the repositories clients
	// may commit to; nil without the file.
	Git *Git
	// Egress is what runs may reach outside their sandboxes, and how.
	Egress Egress
	// PipIndexURL and NPMRegistry are the package indexes runs use.
	PipIndexURL string
	NPMRegistry string

	// CommandTimeout is the commands tools' default and longest time
	// (SANDBOX_TIMEOUT); MaxPerSession and MaxConcurrent bound their
	// executions running at once in a session and in the deployment (0:
	// no limit).
	CommandTimeout time.Duration
	MaxPerSession  int
	MaxConcurrent  int
	// MaxSessions bounds the conversations with a sandbox (0: no limit);
	// a run of another conversation past it is refused (max_sessions).
	MaxSessions int

	LogLevel  string
	LogFormat string
	// LogFile, when set, receives the logs too.
	LogFile string
}

// Egress is the egress policy and the proxy's bounds (SANDBOX_EGRESS_*).
type Egress struct {
	// Allow is what any client may ask for; a tier's egress_domains
	// replaces it for its clients. Empty: no egress.
	Allow          egress.Patterns
	Hosts          egress.Hosts
	MaxBytes       int64 // in + out, per run
	MaxConnections int   // per run
	ConnectTimeout time.Duration
	IdleTimeout    time.Duration
}

// Default package indexes.
const (
	DefaultPipIndexURL = "https://pypi.org/simple"
	DefaultNPMRegistry = "https://registry.npmjs.org/"
)

// S3 is a file store in S3-compatible storage: FILE_STORE=s3://bucket/prefix
// and the AWS SDKs' own variables for where and who.
type S3 struct {
	Bucket string
	Prefix string // "" or ending in '/'
	// Endpoint is AWS_ENDPOINT_URL (or AWS_ENDPOINT_URL_S3); empty: AWS.
	Endpoint string
	Region   string
	// AccessKey, SecretKey and SessionToken are the credentials; without
	// them the shared credentials file and the instance role are tried.
	AccessKey, SecretKey, SessionToken string
}

// FromEnv reads the configuration through getenv (os.Getenv in production).
func FromEnv(getenv func(string) string) (*Config, error) {
	getenv, err := withAliases(getenv)
	if err != nil {
		return nil, err
	}
	p := parser{getenv: getenv}
	hostname, _ := os.Hostname()
	c := &Config{
		HTTPAddr:                 p.str("MCP_HTTP_ADDR", ":8080"),
		RedisURL:                 p.str("REDIS_URL", ""),
		SandboxRoot:              p.str("SANDBOX_ROOT", "./var/sandboxes"),
		FileURLTTL:               p.duration("FILE_URL_TTL", 24*time.Hour),
		PublicBaseURL:            strings.TrimRight(p.str("PUBLIC_BASE_URL", defaultBaseURL(p.str("RUNBOX_PORT", ""), p.str("MCP_HTTP_ADDR", ":8080"))), "/"),
		MemoryLimit:              p.bytes("SANDBOX_MEMORY_LIMIT", "512m"),
		NanoCPUs:                 p.cpus("SANDBOX_CPU_LIMIT", "1.0"),
		PidsLimit:                int64(p.positive("SANDBOX_PIDS_LIMIT", 128)),
		ExecTimeout:              p.duration("SANDBOX_EXEC_TIMEOUT", 60*time.Second),
		MaxOutput:                p.positive("SANDBOX_MAX_OUTPUT_BYTES", 102400),
		MaxCode:                  p.positive("SANDBOX_MAX_CODE_BYTES", 102400),
		MaxUpload:                int64(p.positive("SANDBOX_MAX_UPLOAD_BYTES", 52428800)),
		MaxRead:                  int64(p.positive("SANDBOX_MAX_READ_BYTES", 10485760)),
		BodyBudget:               p.bytes("MCP_HTTP_BODY_BUDGET", "256m"),
		MetricsToken:             strings.TrimSpace(getenv("METRICS_TOKEN")),
		AuditRetention:           p.duration("AUDIT_RETENTION", 2160*time.Hour),
		QuotaBytes:               int64(p.positive("SANDBOX_QUOTA_BYTES", 1073741824)),
		QuotaFiles:               p.positive("SANDBOX_QUOTA_FILES", 100000),
		SessionTTL:               p.duration("SANDBOX_SESSION_TTL", 30*time.Minute),
		MaxQueuedPerConversation: p.positive("SANDBOX_MAX_QUEUED_PER_CONVERSATION", 16),
		QuotaMode:                p.oneOf("SANDBOX_QUOTA_MODE", "auto", "auto", "loop", "walk"),
		MaxInlineImages:          p.nonNegative("SANDBOX_MAX_INLINE_IMAGES", 4),
		MaxInlineImageBytes:      int64(p.positive("SANDBOX_MAX_INLINE_IMAGE_BYTES", 1<<20)),
		Concurrency:              p.positive("EXECUTOR_CONCURRENCY", runtime.NumCPU()),
		MaxDetached:              p.positive("EXECUTOR_MAX_DETACHED", 32),
		MaxWarm:                  p.str("SANDBOX_MAX_WARM", "32"),
		PollInterval:             p.duration("EXECUTOR_POLL_INTERVAL", DefaultPollInterval),
		MetricsAddr:              p.str("EXECUTOR_METRICS_ADDR", ""),
		Pool:                     p.str("SANDBOX_POOL", "1,python=2"),
		ShutdownGrace:            p.duration("EXECUTOR_SHUTDOWN_GRACE", 30*time.Second),
		ExecutorID:               p.str("EXECUTOR_ID", cmp.Or(hostname, "executor")),
		RunnerTag:                p.str("RUNNER_TAG", "latest"),
		Runtime:                  p.str("SANDBOX_RUNTIME", ""),
		PreviewURLTTL:            p.duration("PREVIEW_URL_TTL", time.Hour),
		PreviewMaxRequest:        p.bytes("PREVIEW_MAX_REQUEST_BYTES", "10m"),
		PreviewMaxResponse:       p.bytes("PREVIEW_MAX_RESPONSE_BYTES", "100m"),
		PreviewRate:              p.positive("PREVIEW_RATE", 100),
		ServerTTL:                p.duration("SANDBOX_SERVER_TTL", time.Hour),
		ProjectTTL:               p.duration("SANDBOX_PROJECT_TTL", time.Hour),
		LinkAddr:                 p.str("EXECUTOR_LINK_ADDR", "127.0.0.1:0"),
		LinkAdvertise:            p.str("EXECUTOR_LINK_ADVERTISE", ""),
		LogLevel:                 p.oneOf("LOG_LEVEL", "info", "debug", "info", "warn", "error"),
		LogFormat:                p.oneOf("LOG_FORMAT", "text", "text", "json"),
		LogFile:                  p.str("SANDBOX_LOG_FILE", ""),
		CommandTimeout:           time.Duration(p.positive("SANDBOX_TIMEOUT", 300)) * time.Second,
		MaxPerSession:            p.positive("SANDBOX_MAX_PER_SESSION", 5),
		MaxConcurrent:            p.nonNegative("SANDBOX_MAX_CONCURRENT", 10),
		MaxSessions:              p.nonNegative("SANDBOX_MAX_SESSIONS", 0),
		Egress: Egress{
			MaxBytes:       p.bytes("SANDBOX_EGRESS_MAX_BYTES", "512m"),
			MaxConnections: p.positive("SANDBOX_EGRESS_MAX_CONNECTIONS", egress.DefaultMaxConnections),
			ConnectTimeout: p.duration("SANDBOX_EGRESS_CONNECT_TIMEOUT", egress.DefaultConnectTimeout),
			IdleTimeout:    p.duration("SANDBOX_EGRESS_IDLE_TIMEOUT", egress.DefaultIdleTimeout),
		},
		PipIndexURL: p.indexURL("SANDBOX_PIP_INDEX_URL", DefaultPipIndexURL),
		NPMRegistry: p.indexURL("SANDBOX_NPM_REGISTRY", DefaultNPMRegistry),
	}
	if allow, err := egress.ParseList(p.str("SANDBOX_EGRESS_ALLOW", "")); err != nil {
		p.fail("SANDBOX_EGRESS_ALLOW", err.Error())
	} else {
		c.Egress.Allow = allow
	}
	if hosts, err := egress.ParseHosts(p.str("SANDBOX_EGRESS_HOSTS", "")); err != nil {
		p.fail("SANDBOX_EGRESS_HOSTS", err.Error())
	} else {
		c.Egress.Hosts = hosts
	}
	if cs, err := clients.Load(getenv("MCP_API_TOKEN"), getenv("MCP_API_TOKENS"), strings.TrimSpace(getenv("CLIENTS_FILE"))); err != nil {
		if p.err == nil {
			p.err = err
		}
	} else {
		c.Clients = cs
	}
	c.Secrets = secrets(getenv)
	if file := strings.TrimSpace(getenv("GIT_REPOS_FILE")); file != "" {
		if g, err := loadGit(file, getenv("GIT_API_URL"), clientNames(c.Clients)); err != nil {
			if p.err == nil {
				p.err = err
			}
		} else {
			c.Git = g
		}
	} else if strings.TrimSpace(getenv("GIT_API_URL")) != "" {
		p.fail("GIT_API_URL", "is set without GIT_REPOS_FILE, which names the repositories it serves")
	}
	if v := getenv("SANDBOX_FILE_RETENTION"); v != "" {
		c.FileRetention = p.duration("SANDBOX_FILE_RETENTION", 0)
	}
	if v := getenv("FILE_STORE"); v != "" {
		if c.FileStore = parseS3(v, getenv); c.FileStore == nil {
			p.fail("FILE_STORE", "must be s3://<bucket>[/<prefix>], or unset for the host folder")
		}
	}
	if secret := getenv("FILE_SECRET"); secret != "" {
		if len(secret) < 16 {
			p.fail("FILE_SECRET", "must be at least 16 characters")
		}
		c.FileSecret = []byte(secret)
	}
	if key := getenv("AUDIT_KEY"); key != "" {
		if len(key) < 16 {
			p.fail("AUDIT_KEY", "must be at least 16 characters")
		}
		c.AuditKey = []byte(key)
	}
	for o := range strings.SplitSeq(p.str("MCP_ALLOWED_ORIGINS", ""), ",") {
		if o = strings.TrimSpace(o); o == "" {
			continue
		}
		if !validOrigin(o) {
			p.fail("MCP_ALLOWED_ORIGINS", fmt.Sprintf("must list origins such as https://app.example.com, comma-separated (got %q)", o))
		}
		c.AllowedOrigins = append(c.AllowedOrigins, o)
	}
	if c.RedisURL != "" {
		if _, err := url.Parse(c.RedisURL); err != nil || !strings.HasPrefix(c.RedisURL, "redis") {
			p.fail("REDIS_URL", "must be a redis:// or rediss:// URL")
		}
	}
	if u, err := url.Parse(c.PublicBaseURL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		p.fail("PUBLIC_BASE_URL", "must be an http(s) URL")
	} else {
		c.PreviewScheme = u.Scheme
		c.PreviewDomain = p.str("PREVIEW_BASE_DOMAIN", defaultPreviewDomain(u))
	}
	if c.BodyBudget < c.MaxMCPBody() {
		p.fail("MCP_HTTP_BODY_BUDGET", fmt.Sprintf("must hold at least one largest MCP message, %d bytes (the base64 of SANDBOX_MAX_UPLOAD_BYTES and its envelope)", c.MaxMCPBody()))
	}
	if c.ExecTimeout < time.Second {
		p.fail("SANDBOX_EXEC_TIMEOUT", "must be at least 1s")
	}
	if c.MemoryLimit < 16<<20 {
		p.fail("SANDBOX_MEMORY_LIMIT", "must be at least 16m")
	}
	if c.Runtime != "" && !validExecutorID(c.Runtime) {
		p.fail("SANDBOX_RUNTIME", "must name an OCI runtime the Docker Engine knows, such as runsc")
	}
	if !validExecutorID(c.ExecutorID) {
		p.fail("EXECUTOR_ID", "may hold only letters, digits, '.', '_' and '-' (at most 64)")
	}
	if root, err := filepath.Abs(c.SandboxRoot); err == nil {
		c.SandboxRoot = root
	}
	if p.err != nil {
		return nil, p.err
	}
	return c, nil
}

// secrets returns the secrets the environment gives the service: its
// tokens and keys.
func secrets(getenv func(string) string) []string {
	var out []string
	for _, name := range []string{"MCP_API_TOKEN", "FILE_SECRET", "AUDIT_KEY", "METRICS_TOKEN", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"} {
		if v := strings.TrimSpace(getenv(name)); v != "" {
			out = append(out, v)
		}
	}
	// MCP_API_TOKENS: name:token[:tier], comma-separated.
	for entry := range strings.SplitSeq(getenv("MCP_API_TOKENS"), ",") {
		if _, rest, ok := strings.Cut(strings.TrimSpace(entry), ":"); ok {
			token, _, _ := strings.Cut(rest, ":")
			if token != "" {
				out = append(out, token)
			}
		}
	}
	return out
}

// clientNames are the names of the clients tokens give; "default" when
// there are none, as api then makes the token of the client "default".
func clientNames(cs clients.Clients) map[string]bool {
	names := map[string]bool{}
	for _, c := range cs {
		names[c.Name] = true
	}
	if len(names) == 0 {
		names[runbox.DefaultClient] = true
	}
	return names
}

// parseS3 reads FILE_STORE and the AWS variables; nil if FILE_STORE is
// not an s3:// URL with a valid bucket name.
func parseS3(v string, getenv func(string) string) *S3 {
	u, err := url.Parse(v)
	if err != nil || u.Scheme != "s3" || u.User != nil || u.RawQuery != "" || !validBucket(u.Host) {
		return nil
	}
	prefix := strings.Trim(u.Path, "/")
	if prefix != "" {
		prefix += "/"
	}
	return &S3{
		Bucket:       u.Host,
		Prefix:       prefix,
		Endpoint:     cmp.Or(getenv("AWS_ENDPOINT_URL_S3"), getenv("AWS_ENDPOINT_URL")),
		Region:       cmp.Or(getenv("AWS_REGION"), getenv("AWS_DEFAULT_REGION"), "us-east-1"),
		AccessKey:    getenv("AWS_ACCESS_KEY_ID"),
		SecretKey:    getenv("AWS_SECRET_ACCESS_KEY"),
		SessionToken: getenv("AWS_SESSION_TOKEN"),
	}
}

// validBucket checks S3's rules for bucket names: 3 to 63 lower-case
// letters, digits, '.' and '-', starting and ending with a letter or digit.
func validBucket(b string) bool {
	if len(b) < 3 || len(b) > 63 || strings.HasPrefix(b, "-") || strings.HasSuffix(b, "-") ||
		strings.HasPrefix(b, ".") || strings.HasSuffix(b, ".") {
		return false
	}
	for _, r := range b {
		if !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '.' || r == '-') {
			return false
		}
	}
	return true
}

// DefaultPollInterval is how often an idle executor asks asynq for work. A
// run starts at once without it: every run enqueued is announced to idle
// executors, which wait on the announcements (store.Wake); the poll only
// finds what an announcement missed (an executor that died holding one).
const DefaultPollInterval = time.Second

// defaultBaseURL is http://localhost on the port clients reach api on:
// RUNBOX_PORT, the port docker-compose.yml publishes, or else the one api
// listens on.
func defaultBaseURL(published, addr string) string {
	if published != "" {
		return "http://localhost:" + published
	}
	if _, port, err := net.SplitHostPort(addr); err == nil && port != "" && port != "0" {
		return "http://localhost:" + port
	}
	return "http://localhost:8080"
}

// validOrigin reports whether s is a web origin: http(s)://host[:port],
// nothing after it.
func validOrigin(s string) bool {
	u, err := url.Parse(s)
	return err == nil && (u.Scheme == "http" || u.Scheme == "https") && u.Host != "" && u.User == nil &&
		(u.Path == "" || u.Path == "/") && u.RawQuery == "" && u.Fragment == ""
}

// Origin returns the web origin of PublicBaseURL: the server's own pages'.
func (c *Config) Origin() string {
	u, err := url.Parse(c.PublicBaseURL)
	if err != nil {
		return ""
	}
	return u.Scheme + "://" + u.Host
}

// defaultPreviewDomain is localhost on the port of the api's public URL:
// browsers resolve every name under localhost to the loopback address, so
// <capability>.localhost:<port> reaches the api's port as a host of its own.
func defaultPreviewDomain(public *url.URL) string {
	if port := public.Port(); port != "" {
		return "localhost:" + port
	}
	return "localhost"
}

// MaxMCPBody is the largest MCP message the api reads: the base64 of the
// largest upload, and its envelope.
func (c *Config) MaxMCPBody() int64 { return c.MaxUpload*4/3 + 1<<20 }

// EgressReachable reports whether any client may ask its runs to reach
// anything: SANDBOX_EGRESS_ALLOW, or a tier's egress_domains, names a
// domain.
func (c *Config) EgressReachable() bool {
	if len(c.Egress.Allow) > 0 {
		return true
	}
	for _, cl := range c.Clients {
		if len(cl.Tier.EgressDomains) > 0 {
			return true
		}
	}
	return false
}

// MaxTimeoutSeconds is the largest timeout_seconds a run may ask for.
func (c *Config) MaxTimeoutSeconds() int { return int(c.ExecTimeout / time.Second) }

func validExecutorID(id string) bool {
	if id == "" || len(id) > 64 {
		return false
	}
	for _, r := range id {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '.' || r == '_' || r == '-') {
			return false
		}
	}
	return true
}

// parser keeps the first error, so FromEnv reads as a list of settings.
type parser struct {
	getenv func(string) string
	err    error
}

func (p *parser) fail(name, msg string) {
	if p.err == nil {
		p.err = fmt.Errorf("config: %s %s", name, msg)
	}
}

func (p *parser) str(name, def string) string {
	return cmp.Or(strings.TrimSpace(p.getenv(name)), def)
}

func (p *parser) duration(name string, def time.Duration) time.Duration {
	v := p.getenv(name)
	if v == "" {
		return def
	}
	d, err := time.ParseDuration(v)
	if err != nil || d <= 0 {
		p.fail(name, fmt.Sprintf("must be a positive duration such as 30s or 24h (got %q)", v))
		return def
	}
	return d
}

// positive reads a whole number of at least 1.
func (p *parser) positive(name string, def int) int { return p.atLeast(name, def, 1) }

// nonNegative reads a whole number of at least 0.
func (p *parser) nonNegative(name string, def int) int { return p.atLeast(name, def, 0) }

func (p *parser) atLeast(name string, def, least int) int {
	v := p.getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n < least {
		p.fail(name, fmt.Sprintf("must be a whole number of at least %d (got %q)", least, v))
		return def
	}
	return n
}

func (p *parser) bytes(name, def string) int64 {
	v := p.str(name, def)
	n, err := units.RAMInBytes(v)
	if err != nil || n <= 0 {
		p.fail(name, fmt.Sprintf("must be a size such as 512m or 1g (got %q)", v))
		return 0
	}
	return n
}

func (p *parser) cpus(name, def string) int64 {
	v := p.str(name, def)
	f, err := strconv.ParseFloat(v, 64)
	if err != nil || f <= 0 || f > float64(runtime.NumCPU()*4) {
		p.fail(name, fmt.Sprintf("must be a positive number of cores such as 1.0 (got %q)", v))
		return 0
	}
	return int64(f * 1e9)
}

// indexURL reads the http(s) URL of a package index.
func (p *parser) indexURL(name, def string) string {
	v := p.str(name, def)
	if u, err := url.Parse(v); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Hostname() == "" || u.User != nil {
		p.fail(name, fmt.Sprintf("must be an http(s) URL without credentials (got %q)", v))
	}
	return v
}

func (p *parser) oneOf(name, def string, allowed ...string) string {
	v := strings.ToLower(p.str(name, def))
	for _, a := range allowed {
		if v == a {
			return v
		}
	}
	p.fail(name, fmt.Sprintf("must be one of %s (got %q)", strings.Join(allowed, ", "), v))
	return def
}
