// Package config reads the service's configuration from the environment, as
// the contract lists it. A bad value is an error naming the variable, so a
// process can fail at start with one clear line.
//
// It reads values — numbers, sizes, durations, addresses, names — and knows
// none of the parts that use them: a setting written in a part's own
// syntax (the clients' file, the egress policy's patterns, the git
// repositories' file) is kept as given, and the part reads and checks it
// (app.Load calls them all at start, naming the variable in their errors).
package config

import (
	"cmp"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"time"
)

// Config is every setting of api and executor.
type Config struct {
	HTTPAddr string
	// APIToken, APITokens and ClientsFile are MCP_API_TOKEN,
	// MCP_API_TOKENS and CLIENTS_FILE as given: the clients tokens give,
	// which package clients reads. None: api makes a token.
	APIToken, APITokens, ClientsFile string

	RedisURL      string // empty: embedded
	SandboxRoot   string // absolute
	FileSecret    []byte // empty: load or make one under SandboxRoot
	FileURLTTL    time.Duration
	PublicBaseURL string
	// AllowedOrigins are the web origins, besides PublicBaseURL's, whose
	// requests the api's routes accept (MCP_ALLOWED_ORIGINS).
	AllowedOrigins []string
	// UnauthorizedPerMinute is how many requests without a valid token a
	// source may make in a minute before it is answered 429.
	UnauthorizedPerMinute int
	// TrustedProxies are the peers whose X-Forwarded-For names a
	// request's source (MCP_TRUSTED_PROXIES); none: the peer is.
	TrustedProxies []netip.Prefix

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
	// AuditMaxRedisEntries bounds the sealed audit entries Redis holds;
	// the oldest past it go to the file store (0: no bound).
	AuditMaxRedisEntries int
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
	// MaxQueuedPerClient and MaxQueuedBytesPerClient bound the runs a
	// client has waiting to start and the bytes they hold in Redis, for
	// clients whose tier sets no bound of its own (0: none).
	MaxQueuedPerClient      int
	MaxQueuedBytesPerClient int64
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
	// Engine runs sandboxes: "docker" (containers of the executor's host)
	// or "kubernetes" (pods, see docs/kubernetes.md).
	Engine string
	// Kubernetes is the Kubernetes engine's settings.
	Kubernetes Kubernetes

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
	// PreviewStreamIdle ends an upgraded preview stream (WebSocket) idle
	// both ways this long; PreviewMaxStreams and
	// PreviewMaxStreamsPerConversation bound those open at once through
	// the process and to one conversation.
	PreviewStreamIdle                time.Duration
	PreviewMaxStreams                int
	PreviewMaxStreamsPerConversation int
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
	// GitReposFile and GitAPIURL are GIT_REPOS_FILE and GIT_API_URL: the
	// repositories clients may commit to, which package gitexport reads;
	// "" without.
	GitReposFile, GitAPIURL string
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

	// Webhooks are the webhooks' settings (WEBHOOK_*).
	Webhooks Webhooks

	LogLevel  string
	LogFormat string
	// LogFile, when set, receives the logs too.
	LogFile string
}

// Webhooks are where callbacks may go and how they are retried.
type Webhooks struct {
	// Secret are the signing secrets of the client "default"
	// (WEBHOOK_SECRET: the current first, comma-separated while
	// rotating); other clients' are in CLIENTS_FILE.
	Secret []string
	// Allow and Hosts are WEBHOOK_ALLOW and WEBHOOK_HOSTS as given, which
	// package egress reads: the hosts any client's callbacks may go to,
	// and names resolved to fixed addresses (plain http allowed to them,
	// on the mapped port only).
	Allow, Hosts string
	// Backoff is the first retry's delay, doubling with jitter; RetryFor
	// how long a webhook is retried.
	Backoff  time.Duration
	RetryFor time.Duration
	// PerClient bounds one client's webhooks being sent at once by an
	// api (WEBHOOK_CONCURRENCY_PER_CLIENT): its share of the api's
	// webhook workers.
	PerClient int
}

// Egress is the egress policy and the proxy's bounds (SANDBOX_EGRESS_*).
type Egress struct {
	// Allow, Hosts and Deny are SANDBOX_EGRESS_ALLOW, _HOSTS and
	// _DENY_CIDRS as given, which package egress reads: what any client
	// may ask for (a tier's egress_domains replaces it for its clients;
	// empty: no egress), names resolved to fixed addresses, and address
	// ranges no connection may go to.
	Allow, Hosts, Deny string
	MaxBytes           int64 // in + out, per run
	MaxConnections     int   // per run
	ConnectTimeout     time.Duration
	IdleTimeout        time.Duration
	// SecretsFile is SANDBOX_SECRETS_FILE, which package egress reads: the
	// operator's secrets, which runs' requests to their domains carry and
	// their programs never see.
	SecretsFile string
	// UpstreamRoots verify the servers of the secrets' domains: the
	// system's roots and SANDBOX_EGRESS_CA_FILE's; nil: the system's.
	UpstreamRoots *x509.CertPool
}

// Default package indexes.
// What a client may have waiting to start by default: two full batches,
// and bytes a Redis of the deployed 256 MB holds several clients' worth
// of (each waiting run costs Redis about what it counts: store's
// TestQueuedBytes).
const (
	DefaultMaxQueuedPerClient      = 2000
	DefaultMaxQueuedBytesPerClient = 32 << 20
)

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
// Each group of settings is read, and checked, by a method of its own; the
// first bad value is the error.
func FromEnv(getenv func(string) string) (*Config, error) {
	getenv, err := withAliases(getenv)
	if err != nil {
		return nil, err
	}
	p := parser{getenv: getenv}
	c := &Config{}
	p.files(c)
	public := p.server(c)
	p.sandbox(c)
	p.commands(c)
	p.executor(c)
	p.audit(c)
	p.previews(c, public)
	c.Egress = p.egress()
	c.Webhooks = p.webhooks()
	p.clients(c)
	c.Secrets = secrets(getenv)
	p.git(c)
	p.logs(c)
	if p.err != nil {
		return nil, p.err
	}
	return c, nil
}

// files reads where conversations' files live and how much they may hold
// (SANDBOX_ROOT, FILE_*, SANDBOX_QUOTA_*, the files tools' bounds).
func (p *parser) files(c *Config) {
	c.SandboxRoot = p.str("SANDBOX_ROOT", "./var/sandboxes")
	if root, err := filepath.Abs(c.SandboxRoot); err == nil {
		c.SandboxRoot = root
	}
	c.FileURLTTL = p.duration("FILE_URL_TTL", 24*time.Hour)
	c.MaxUpload = int64(p.positive("SANDBOX_MAX_UPLOAD_BYTES", 52428800))
	c.MaxRead = int64(p.positive("SANDBOX_MAX_READ_BYTES", 10485760))
	c.QuotaBytes = int64(p.positive("SANDBOX_QUOTA_BYTES", 1073741824))
	c.QuotaFiles = p.positive("SANDBOX_QUOTA_FILES", 100000)
	c.QuotaMode = p.oneOf("SANDBOX_QUOTA_MODE", "auto", "auto", "loop", "walk")
	if v := p.getenv("SANDBOX_FILE_RETENTION"); v != "" {
		c.FileRetention = p.duration("SANDBOX_FILE_RETENTION", 0)
	}
	if v := p.getenv("FILE_STORE"); v != "" {
		if c.FileStore = parseS3(v, p.getenv); c.FileStore == nil {
			p.fail("FILE_STORE", "must be s3://<bucket>[/<prefix>], or unset for the host folder")
		}
	}
	if secret := p.getenv("FILE_SECRET"); secret != "" {
		if len(secret) < 16 {
			p.fail("FILE_SECRET", "must be at least 16 characters")
		}
		c.FileSecret = []byte(secret)
	}
}

// server reads how the api serves (MCP_*, PUBLIC_BASE_URL, REDIS_URL,
// METRICS_TOKEN) and returns PUBLIC_BASE_URL parsed, nil if it is bad. It
// reads after files: the body budget must hold the largest upload.
func (p *parser) server(c *Config) (public *url.URL) {
	c.HTTPAddr = p.str("MCP_HTTP_ADDR", ":8080")
	c.RedisURL = p.str("REDIS_URL", "")
	c.PublicBaseURL = strings.TrimRight(p.str("PUBLIC_BASE_URL", defaultBaseURL(p.str("RUNBOX_PORT", ""), c.HTTPAddr)), "/")
	c.BodyBudget = p.bytes("MCP_HTTP_BODY_BUDGET", "256m")
	c.UnauthorizedPerMinute = p.positive("MCP_UNAUTHORIZED_PER_MINUTE", 60)
	c.MetricsToken = strings.TrimSpace(p.getenv("METRICS_TOKEN"))
	for o := range strings.SplitSeq(p.str("MCP_ALLOWED_ORIGINS", ""), ",") {
		if o = strings.TrimSpace(o); o == "" {
			continue
		}
		if !validOrigin(o) {
			p.fail("MCP_ALLOWED_ORIGINS", fmt.Sprintf("must list origins such as https://app.example.com, comma-separated (got %q)", o))
		}
		c.AllowedOrigins = append(c.AllowedOrigins, o)
	}
	for v := range strings.SplitSeq(p.str("MCP_TRUSTED_PROXIES", ""), ",") {
		if v = strings.TrimSpace(v); v == "" {
			continue
		}
		pfx, err := netip.ParsePrefix(v)
		if err != nil {
			addr, aerr := netip.ParseAddr(v)
			if aerr != nil {
				p.fail("MCP_TRUSTED_PROXIES", fmt.Sprintf("must list addresses or ranges such as 10.0.0.5 or 10.0.0.0/8, comma-separated (got %q)", v))
				continue
			}
			pfx = netip.PrefixFrom(addr.Unmap(), addr.Unmap().BitLen())
		}
		c.TrustedProxies = append(c.TrustedProxies, pfx.Masked())
	}
	if c.RedisURL != "" {
		if _, err := url.Parse(c.RedisURL); err != nil || !strings.HasPrefix(c.RedisURL, "redis") {
			p.fail("REDIS_URL", "must be a redis:// or rediss:// URL")
		}
	}
	if u, err := url.Parse(c.PublicBaseURL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		p.fail("PUBLIC_BASE_URL", "must be an http(s) URL")
	} else {
		public = u
	}
	if c.BodyBudget < c.MaxMCPBody() {
		p.fail("MCP_HTTP_BODY_BUDGET", fmt.Sprintf("must hold at least one largest MCP message, %d bytes (the base64 of SANDBOX_MAX_UPLOAD_BYTES and its envelope)", c.MaxMCPBody()))
	}
	return public
}

// sandbox reads a sandbox's limits and what runs in it may use
// (SANDBOX_*: resources, output, images, sessions, warm sandboxes, package
// indexes).
func (p *parser) sandbox(c *Config) {
	c.MemoryLimit = p.bytes("SANDBOX_MEMORY_LIMIT", "512m")
	c.NanoCPUs = p.cpus("SANDBOX_CPU_LIMIT", "1.0")
	c.PidsLimit = int64(p.positive("SANDBOX_PIDS_LIMIT", 128))
	c.ExecTimeout = p.duration("SANDBOX_EXEC_TIMEOUT", 60*time.Second)
	c.MaxOutput = p.positive("SANDBOX_MAX_OUTPUT_BYTES", 102400)
	c.MaxCode = p.positive("SANDBOX_MAX_CODE_BYTES", 102400)
	c.MaxInlineImages = p.nonNegative("SANDBOX_MAX_INLINE_IMAGES", 4)
	c.MaxInlineImageBytes = int64(p.positive("SANDBOX_MAX_INLINE_IMAGE_BYTES", 1<<20))
	c.SessionTTL = p.duration("SANDBOX_SESSION_TTL", 30*time.Minute)
	c.MaxQueuedPerConversation = p.positive("SANDBOX_MAX_QUEUED_PER_CONVERSATION", 16)
	c.MaxQueuedPerClient = p.nonNegative("SANDBOX_MAX_QUEUED_PER_CLIENT", DefaultMaxQueuedPerClient)
	c.MaxQueuedBytesPerClient = int64(p.nonNegative("SANDBOX_MAX_QUEUED_BYTES_PER_CLIENT", DefaultMaxQueuedBytesPerClient))
	c.MaxSessions = p.nonNegative("SANDBOX_MAX_SESSIONS", 0)
	c.MaxWarm = p.str("SANDBOX_MAX_WARM", "32")
	c.Pool = p.str("SANDBOX_POOL", "1,python=2")
	c.Runtime = p.str("SANDBOX_RUNTIME", "")
	c.ServerTTL = p.duration("SANDBOX_SERVER_TTL", time.Hour)
	c.ProjectTTL = p.duration("SANDBOX_PROJECT_TTL", time.Hour)
	c.PipIndexURL = p.indexURL("SANDBOX_PIP_INDEX_URL", DefaultPipIndexURL)
	c.NPMRegistry = p.indexURL("SANDBOX_NPM_REGISTRY", DefaultNPMRegistry)
	if c.ExecTimeout < time.Second {
		p.fail("SANDBOX_EXEC_TIMEOUT", "must be at least 1s")
	}
	if c.MemoryLimit < 16<<20 {
		p.fail("SANDBOX_MEMORY_LIMIT", "must be at least 16m")
	}
	if c.Runtime != "" && !validExecutorID(c.Runtime) {
		p.fail("SANDBOX_RUNTIME", "must name an OCI runtime the Docker Engine knows, such as runsc")
	}
	p.engine(c)
}

// Kubernetes is where the Kubernetes engine makes sandbox pods.
type Kubernetes struct {
	// Kubeconfig is the kubeconfig file (KUBECONFIG); "" is the
	// executor's own pod's service account (in-cluster).
	Kubeconfig string
	// Namespace holds the sandbox pods (SANDBOX_K8S_NAMESPACE).
	Namespace string
	// RuntimeClass is their runtimeClassName (SANDBOX_K8S_RUNTIME_CLASS),
	// e.g. runsc for gVisor; "" is the cluster's default.
	RuntimeClass string
	// RunnersFile lists the runner images the executor offers
	// (SANDBOX_RUNNERS_FILE, package runnerlist): a cluster cannot say
	// which images its nodes hold. The Kubernetes engine needs it.
	RunnersFile string
}

// engine reads SANDBOX_ENGINE and the Kubernetes engine's settings.
func (p *parser) engine(c *Config) {
	c.Engine = p.oneOf("SANDBOX_ENGINE", "docker", "docker", "kubernetes")
	c.Kubernetes = Kubernetes{
		Kubeconfig:   p.str("KUBECONFIG", ""),
		Namespace:    p.str("SANDBOX_K8S_NAMESPACE", "runbox-sandboxes"),
		RuntimeClass: p.str("SANDBOX_K8S_RUNTIME_CLASS", ""),
		RunnersFile:  p.str("SANDBOX_RUNNERS_FILE", ""),
	}
	if c.Kubernetes.RunnersFile != "" && c.Engine != "kubernetes" {
		// The Docker engine finds its runners in the Docker Engine; a list
		// it would ignore is a mistake worth saying.
		p.fail("SANDBOX_RUNNERS_FILE", "is read by the Kubernetes engine alone (SANDBOX_ENGINE=kubernetes)")
	}
	if !dnsLabel.MatchString(c.Kubernetes.Namespace) {
		p.fail("SANDBOX_K8S_NAMESPACE", "must be a Kubernetes namespace's name (lower-case letters, digits and '-', at most 63)")
	}
	if rc := c.Kubernetes.RuntimeClass; rc != "" && !dnsLabel.MatchString(rc) {
		p.fail("SANDBOX_K8S_RUNTIME_CLASS", "must be a RuntimeClass's name, such as runsc")
	}
}

// dnsLabel is a Kubernetes name of one DNS label.
var dnsLabel = regexp.MustCompile(`^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$`)

// commands reads the commands tools' timeout and bounds (SANDBOX_TIMEOUT,
// SANDBOX_MAX_PER_SESSION, SANDBOX_MAX_CONCURRENT).
func (p *parser) commands(c *Config) {
	c.CommandTimeout = time.Duration(p.positive("SANDBOX_TIMEOUT", 300)) * time.Second
	c.MaxPerSession = p.positive("SANDBOX_MAX_PER_SESSION", 5)
	c.MaxConcurrent = p.nonNegative("SANDBOX_MAX_CONCURRENT", 10)
}

// executor reads how an executor takes and runs work (EXECUTOR_*,
// RUNNER_TAG).
func (p *parser) executor(c *Config) {
	hostname, _ := os.Hostname()
	c.Concurrency = p.positive("EXECUTOR_CONCURRENCY", runtime.NumCPU())
	c.MaxDetached = p.positive("EXECUTOR_MAX_DETACHED", 32)
	c.PollInterval = p.duration("EXECUTOR_POLL_INTERVAL", DefaultPollInterval)
	c.MetricsAddr = p.str("EXECUTOR_METRICS_ADDR", "")
	c.ShutdownGrace = p.duration("EXECUTOR_SHUTDOWN_GRACE", 30*time.Second)
	c.ExecutorID = p.str("EXECUTOR_ID", cmp.Or(hostname, "executor"))
	c.RunnerTag = p.str("RUNNER_TAG", "latest")
	c.LinkAddr = p.str("EXECUTOR_LINK_ADDR", "127.0.0.1:0")
	c.LinkAdvertise = p.str("EXECUTOR_LINK_ADVERTISE", "")
	if !validExecutorID(c.ExecutorID) {
		p.fail("EXECUTOR_ID", "may hold only letters, digits, '.', '_' and '-' (at most 64)")
	}
}

// audit reads AUDIT_*.
func (p *parser) audit(c *Config) {
	c.AuditRetention = p.duration("AUDIT_RETENTION", 2160*time.Hour)
	c.AuditMaxRedisEntries = p.nonNegative("AUDIT_MAX_REDIS_ENTRIES", 100000)
	if key := p.getenv("AUDIT_KEY"); key != "" {
		if len(key) < 16 {
			p.fail("AUDIT_KEY", "must be at least 16 characters")
		}
		c.AuditKey = []byte(key)
	}
}

// previews reads PREVIEW_*; where previews are served follows public, the
// api's parsed PUBLIC_BASE_URL (nil: it is bad, and already the error).
func (p *parser) previews(c *Config, public *url.URL) {
	c.PreviewURLTTL = p.duration("PREVIEW_URL_TTL", time.Hour)
	c.PreviewMaxRequest = p.bytes("PREVIEW_MAX_REQUEST_BYTES", "10m")
	c.PreviewMaxResponse = p.bytes("PREVIEW_MAX_RESPONSE_BYTES", "100m")
	c.PreviewRate = p.positive("PREVIEW_RATE", 100)
	c.PreviewStreamIdle = p.duration("PREVIEW_WS_IDLE", 10*time.Minute)
	c.PreviewMaxStreams = p.positive("PREVIEW_MAX_STREAMS", 1000)
	c.PreviewMaxStreamsPerConversation = p.positive("PREVIEW_MAX_STREAMS_PER_CONVERSATION", 32)
	if public != nil {
		c.PreviewScheme = public.Scheme
		c.PreviewDomain = p.str("PREVIEW_BASE_DOMAIN", defaultPreviewDomain(public))
	}
}

// egress reads SANDBOX_EGRESS_* and SANDBOX_SECRETS_FILE. The proxy's
// bounds default as the proxy's own (egress.Default*).
func (p *parser) egress() Egress {
	e := Egress{
		Allow:          p.str("SANDBOX_EGRESS_ALLOW", ""),
		Hosts:          p.str("SANDBOX_EGRESS_HOSTS", ""),
		Deny:           p.str("SANDBOX_EGRESS_DENY_CIDRS", ""),
		MaxBytes:       p.bytes("SANDBOX_EGRESS_MAX_BYTES", "512m"),
		MaxConnections: p.positive("SANDBOX_EGRESS_MAX_CONNECTIONS", 256),
		ConnectTimeout: p.duration("SANDBOX_EGRESS_CONNECT_TIMEOUT", 10*time.Second),
		IdleTimeout:    p.duration("SANDBOX_EGRESS_IDLE_TIMEOUT", time.Minute),
		SecretsFile:    strings.TrimSpace(p.getenv("SANDBOX_SECRETS_FILE")),
	}
	if file := strings.TrimSpace(p.getenv("SANDBOX_EGRESS_CA_FILE")); file != "" {
		if pool, err := upstreamRoots(file); err != nil {
			p.fail("SANDBOX_EGRESS_CA_FILE", err.Error())
		} else {
			e.UpstreamRoots = pool
		}
	}
	return e
}

// clients reads where the clients tokens give are (MCP_API_TOKEN,
// MCP_API_TOKENS, CLIENTS_FILE).
func (p *parser) clients(c *Config) {
	c.APIToken = p.getenv("MCP_API_TOKEN")
	c.APITokens = p.getenv("MCP_API_TOKENS")
	c.ClientsFile = strings.TrimSpace(p.getenv("CLIENTS_FILE"))
}

// git reads GIT_REPOS_FILE and GIT_API_URL.
func (p *parser) git(c *Config) {
	c.GitReposFile = strings.TrimSpace(p.getenv("GIT_REPOS_FILE"))
	c.GitAPIURL = p.getenv("GIT_API_URL")
	if c.GitReposFile == "" && strings.TrimSpace(c.GitAPIURL) != "" {
		p.fail("GIT_API_URL", "is set without GIT_REPOS_FILE, which names the repositories it serves")
	}
}

// logs reads LOG_LEVEL, LOG_FORMAT and SANDBOX_LOG_FILE.
func (p *parser) logs(c *Config) {
	c.LogLevel = p.oneOf("LOG_LEVEL", "info", "debug", "info", "warn", "error")
	c.LogFormat = p.oneOf("LOG_FORMAT", "text", "text", "json")
	c.LogFile = p.str("SANDBOX_LOG_FILE", "")
}

// webhooks reads WEBHOOK_*.
func (p *parser) webhooks() Webhooks {
	w := Webhooks{
		Allow:    p.str("WEBHOOK_ALLOW", ""),
		Hosts:    p.str("WEBHOOK_HOSTS", ""),
		Backoff:  p.duration("WEBHOOK_BACKOFF", 5*time.Second),
		RetryFor: p.duration("WEBHOOK_RETRY_FOR", 24*time.Hour),
		// The default is webhooks.DefaultPerClient: 4 of an api's 16.
		PerClient: p.positive("WEBHOOK_CONCURRENCY_PER_CLIENT", 4),
	}
	for v := range strings.SplitSeq(p.str("WEBHOOK_SECRET", ""), ",") {
		if v = strings.TrimSpace(v); v != "" {
			w.Secret = append(w.Secret, v)
		}
	}
	return w
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
	// WEBHOOK_SECRET: comma-separated while rotating.
	for v := range strings.SplitSeq(getenv("WEBHOOK_SECRET"), ",") {
		if v = strings.TrimSpace(v); v != "" {
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

// upstreamRoots reads SANDBOX_EGRESS_CA_FILE: PEM certificates trusted,
// besides the system's roots, for the servers of the secrets' domains.
func upstreamRoots(file string) (*x509.CertPool, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	pool, err := x509.SystemCertPool()
	if err != nil {
		pool = x509.NewCertPool()
	}
	if !pool.AppendCertsFromPEM(b) {
		return nil, errors.New("holds no PEM certificate")
	}
	return pool, nil
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
// executors, which wait on the announcements (store.Executors.Wake); the
// poll only finds what an announcement missed (an executor that died
// holding one).
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
