package app

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"path/filepath"
	"sync"
	"time"

	mcpsdk "github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/jonboulle/clockwork"

	"github.com/runbox-dev/runbox"
	"github.com/runbox-dev/runbox/internal/api"
	"github.com/runbox-dev/runbox/internal/audit"
	"github.com/runbox-dev/runbox/internal/auth"
	"github.com/runbox-dev/runbox/internal/clients"
	"github.com/runbox-dev/runbox/internal/commands"
	"github.com/runbox-dev/runbox/internal/config"
	"github.com/runbox-dev/runbox/internal/conversations"
	"github.com/runbox-dev/runbox/internal/e2b"
	"github.com/runbox-dev/runbox/internal/files"
	"github.com/runbox-dev/runbox/internal/gitexport"
	"github.com/runbox-dev/runbox/internal/leader"
	"github.com/runbox-dev/runbox/internal/lifecycle"
	"github.com/runbox-dev/runbox/internal/mcp"
	"github.com/runbox-dev/runbox/internal/queue"
	"github.com/runbox-dev/runbox/internal/refusals"
	"github.com/runbox-dev/runbox/internal/runs"
	"github.com/runbox-dev/runbox/internal/sessions"
	"github.com/runbox-dev/runbox/internal/snapshot"
	"github.com/runbox-dev/runbox/internal/store"
	"github.com/runbox-dev/runbox/internal/store/auditlog"
	"github.com/runbox-dev/runbox/internal/store/stream"
	"github.com/runbox-dev/runbox/internal/watchdog"
	"github.com/runbox-dev/runbox/internal/webhooks"
	"github.com/runbox-dev/runbox/internal/workcopy"
)

// maxStdin bounds the stdin a run may be given up front.
const maxStdin = 1 << 20

// APIOptions say how the api process serves.
type APIOptions struct {
	// Stdio serves MCP on Stdin/Stdout instead of HTTP.
	Stdio  bool
	Stdin  io.ReadCloser
	Stdout io.WriteCloser
	// Banner receives the start-up message (the token and client config).
	Banner io.Writer
	Logger *slog.Logger
	// Ready, when set, receives the HTTP address once the server listens.
	Ready chan<- string
}

// RunAPI runs the api process until ctx ends: over HTTP, or over stdio.
// Without REDIS_URL it embeds Redis and an executor.
func RunAPI(ctx context.Context, cfg *Config, opts APIOptions) error {
	cs, generated := cfg.Clients, ""
	if len(cs) == 0 {
		generated = "rb_" + rand.Text()
		var err error
		if cs, err = clients.Load(generated, "", ""); err != nil {
			return err
		}
	}
	rds, err := OpenRedis(ctx, cfg.Config)
	if err != nil {
		return err
	}
	defer rds.Close()
	a := &apiProcess{cfg: cfg, log: opts.Logger, clients: cs, generated: generated, rds: rds,
		unserved: opts.Stdio && rds.Embedded()}
	// The parts stop, the last started first, on any return: those the
	// steps started before one failed too.
	defer func() { a.parts.Stop() }()
	if err := a.startCore(ctx); err != nil {
		return err
	}
	if err := a.startFiles(ctx); err != nil {
		return err
	}
	if err := a.startExecutors(ctx); err != nil {
		return err
	}
	if err := a.startRuns(ctx); err != nil {
		return err
	}
	if err := a.startMCP(ctx); err != nil {
		return err
	}
	if err := a.startPreviewsAndJanitor(ctx); err != nil {
		return err
	}
	if err := a.startE2B(ctx); err != nil {
		a.shutdownExecutor()
		return err
	}
	if opts.Stdio {
		return a.serveStdio(ctx, opts)
	}
	return a.serveHTTP(ctx, opts)
}

// apiProcess is the api process's parts, built and started by RunAPI's
// steps in order, each on those before it.
type apiProcess struct {
	cfg       *Config
	log       *slog.Logger
	clients   clients.Clients
	generated string // the token made for a deployment that names none
	rds       *Redis
	unserved  bool // no process serves preview hosts (stdio, embedded Redis)
	// parts are those started so far, in order: a part may depend on those
	// before it, and they stop in reverse.
	parts lifecycle.Group

	registry  *prometheus.Registry
	st        *store.Store
	hub       *stream.Hub
	sched     *queue.Scheduler
	secret    []byte
	signer    *files.Signer
	ready     map[string]api.Check
	clock     clockwork.Clock
	elector   *leader.Elector
	fileStore runbox.FileStore
	state     snapshot.Blobs  // where kept interpreters' saved state is, beside the files
	archive   audit.Archive   // where the audit log's oldest entries go
	janitor   lifecycle.Group // the maintenance of the files: by the leader
	ex        *Executor       // embedded, or nil
	runs      *runs.Service
	hooks     *webhooks.Service
	convs     *conversations.Service
	recorder  *audit.Recorder
	strangers *refusals.Limiter
	sessions  *sessions.Service
	mcp       *mcp.Server
	previews  *previews
	e2b       *e2b.Handler
	// inFlight counts clients' requests in flight, MCP, REST and E2B's.
	inFlight *clients.InFlight
}

// start starts s with ctx and adds it to the parts.
func (a *apiProcess) start(ctx context.Context, s lifecycle.Service) error {
	if err := s.Start(ctx); err != nil {
		return err
	}
	a.parts = append(a.parts, s)
	return nil
}

// started is a part started where it was built, or a resource it holds:
// the parts only stop it.
type started func()

func (started) Start(context.Context) error { return nil }
func (f started) Stop()                     { f() }

// startCore builds what every other part uses: the metrics, the store and
// its hub, the shared secret, and the elector of the deployment's leader.
func (a *apiProcess) startCore(ctx context.Context) error {
	a.registry = prometheus.NewRegistry()
	a.registry.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	// Every command's reply is watched for Redis refusing writes.
	writes := a.rds.Conn.WatchWrites(a.registry, a.log)
	// What runs cost in waits on Redis (make bench reads it).
	a.rds.Conn.CountRoundTrips(a.registry)
	a.st = store.New(a.rds.Conn)
	a.hub = stream.NewHub(a.rds.Conn, a.st.Runs, a.log)
	a.parts = append(a.parts, started(func() { a.hub.Close() }))
	a.sched = queue.NewScheduler(a.st, queue.NewClient(a.rds.Conn), a.log)
	secret, err := Secret(ctx, a.cfg.Config, a.st.Conversations)
	if err != nil {
		return err
	}
	a.secret, a.signer = secret, Signer(a.cfg.Config, secret)
	a.ready = map[string]api.Check{"redis": func(ctx context.Context) error { return writes.Check(ctx) }}
	a.clock = clockwork.NewRealClock()
	a.elector = leader.NewElector(a.st.Executors, "api", a.clock, a.log)
	return a.start(context.WithoutCancel(ctx), a.elector)
}

// startFiles opens the store the api reads and writes conversations'
// files through: the host folder the executors share, or a remote store.
// Their maintenance (janitor) starts last.
func (a *apiProcess) startFiles(ctx context.Context) error {
	if a.cfg.FileStore != nil {
		s3, err := OpenS3(ctx, a.cfg.Config)
		if err != nil {
			return err
		}
		a.fileStore, a.state = workcopy.NewVersioned(s3, a.st.Conversations), s3
		a.archive = s3.AuditArchive()
		a.ready["files"] = s3.Ping
		if a.cfg.FileRetention > 0 {
			a.janitor = append(a.janitor, conversations.NewExpiry(a.fileStore, a.st.Conversations, a.cfg.FileRetention, a.clock,
				a.elector.Every, a.log))
		}
		return nil
	}
	folders, err := Folders(a.cfg.Config)
	if err != nil {
		return err
	}
	a.fileStore, a.state = files.NewHostStore(folders), folders
	if a.archive, err = audit.NewDirArchive(filepath.Join(a.cfg.SandboxRoot, ".audit")); err != nil {
		return err
	}
	a.janitor = append(a.janitor, conversations.NewJanitor(folders, a.st.Conversations, a.cfg.SessionTTL, a.cfg.FileRetention,
		a.elector.Every, a.log))
	return nil
}

// startExecutors starts the embedded executor, with embedded Redis, or
// else the watchdog of the executors elsewhere.
func (a *apiProcess) startExecutors(ctx context.Context) error {
	if a.rds.Embedded() {
		ex, err := StartExecutor(ctx, a.cfg, a.rds.Conn, a.elector, a.registry, a.log, false)
		if err != nil {
			return err
		}
		a.ex = ex
		a.parts = append(a.parts, started(ex.Close))
		a.ready["docker"] = ex.Sandboxes.Ping
		return nil
	}
	// The leader runs the watchdog; the api takes part, so that lost runs
	// end even when no executor is left.
	if err := a.start(context.WithoutCancel(ctx), watchdog.New(a.st.Runs, a.sched, a.elector.Every, a.log)); err != nil {
		return err
	}
	a.ready["executors"] = func(ctx context.Context) error {
		infos, err := a.st.Executors.LiveExecutors(ctx)
		if err == nil && len(infos) == 0 {
			err = errors.New("no executor is running")
		}
		return err
	}
	return nil
}

// startRuns builds the runs' and conversations' services, starts the
// webhooks' delivery, and the audit log's sealer.
func (a *apiProcess) startRuns(ctx context.Context) error {
	cfg := a.cfg
	a.runs = runs.NewService(a.st, a.hub, a.sched, runs.Limits{
		MaxCodeBytes:             cfg.MaxCode,
		MaxTimeoutSeconds:        cfg.MaxTimeoutSeconds(),
		MaxCommandTimeoutSeconds: int(cfg.CommandTimeout / time.Second),
		MaxSessions:              cfg.MaxSessions,
		MaxStdinBytes:            maxStdin,
		MaxWaiting:               cfg.MaxQueuedPerConversation,
		MaxQueuedRuns:            cfg.MaxQueuedPerClient,
		MaxQueuedBytes:           cfg.MaxQueuedBytesPerClient,
		ClientStorage:            a.fileStore.ClientUsage,
		EgressAllow:              cfg.EgressPolicy.Allow,
		EgressReachable:          cfg.EgressReachable(),
		Secrets:                  cfg.EgressPolicy.Secrets.WithoutValues(),
	}, a.log)
	a.runs.Metrics = clients.NewMetrics(a.registry)
	hooks, hookParts, err := startWebhooks(ctx, cfg, a.clients, a.rds.Conn, a.st, a.registry, a.log)
	if err != nil {
		return err
	}
	// Stopped before Redis closes: deliveries under way may finish.
	a.parts = append(a.parts, hookParts)
	a.hooks, a.runs.Callbacks = hooks, hooks
	// Forks get their source's kept state re-sealed here, in the api, with
	// the deployment's secret, as executors seal it: never in a sandbox.
	forker := snapshot.NewKeeper(a.state, a.st.Conversations, a.secret, a.log.With("component", "snapshot"))
	a.convs = conversations.NewService(a.fileStore, a.signer, a.runs, a.st, forker, conversations.Limits{
		Quota:               cfg.QuotaBytes,
		MaxUpload:           cfg.MaxUpload,
		MaxRead:             cfg.MaxRead,
		MaxInlineImages:     cfg.MaxInlineImages,
		MaxInlineImageBytes: cfg.MaxInlineImageBytes,
	})
	chain, err := AuditChain(cfg.Config)
	if err != nil {
		return err
	}
	auditLog := auditlog.New(a.rds.Conn)
	a.recorder = audit.NewRecorder(auditLog, a.clock, a.log)
	sealer := audit.NewSealer(auditLog, chain, cfg.AuditRetention, a.clock, a.log)
	sealer.Archive(a.archive, cfg.AuditMaxRedisEntries)
	if err := a.start(context.WithoutCancel(ctx), sealer); err != nil {
		return err
	}
	a.strangers = refusals.New(refusals.Options{Budget: cfg.UnauthorizedPerMinute, Audit: a.recorder,
		Registerer: a.registry, Clock: a.clock, Logger: a.log})
	return nil
}

// startMCP builds the MCP server and the commands tools whose executions
// its sessions scope, starts the janitor of those sessions (the leader
// ends the sessions idle past SANDBOX_SESSION_TTL), and checks the git
// export's repositories.
func (a *apiProcess) startMCP(ctx context.Context) error {
	cfg := a.cfg
	a.sessions = sessions.New(a.st.Sessions, cfg.SessionTTL, a.clock, a.log)
	executions := commands.New(a.runs, a.convs, a.st, a.sessions, commands.Limits{
		TimeoutSeconds: int(cfg.CommandTimeout / time.Second), PerSession: cfg.MaxPerSession,
		Total: cfg.MaxConcurrent, MaxCommandBytes: cfg.MaxCode,
	}, a.log)
	a.mcp = mcp.New(ctx, mcp.Options{Runs: a.runs, Conversations: a.convs, Executions: executions,
		Sessions: a.sessions, Audit: a.recorder, Log: a.log})
	commands.Register(a.mcp, executions)
	if err := a.start(context.WithoutCancel(ctx), sessions.NewJanitor(a.sessions, a.elector.Every)); err != nil {
		return err
	}
	if cfg.Git == nil {
		return nil
	}
	git, err := gitexport.New(gitexport.Options{Git: cfg.Git, Owners: a.st.Git, Files: a.fileStore, Audit: a.recorder,
		Clock: a.clock, Log: a.log})
	if err != nil {
		return err
	}
	// A token refused for its breadth stops the start; any other problem
	// is logged and shows in /readyz.
	if err := git.Start(ctx); err != nil {
		return err
	}
	gitexport.Register(a.mcp, git)
	a.ready["git"] = git.Ready
	return nil
}

// startPreviewsAndJanitor starts the previews' parts, then the
// maintenance of the files.
func (a *apiProcess) startPreviewsAndJanitor(ctx context.Context) error {
	pv, err := startPreviews(ctx, a.cfg.Config, previewDeps{store: a.st, secret: a.secret, executor: a.ex, mcp: a.mcp,
		runs: a.runs, convs: a.convs, ready: a.ready, elector: a.elector, clock: a.clock,
		secrets: []string{string(a.secret), a.generated}, unserved: a.unserved, log: a.log})
	if err != nil {
		a.shutdownExecutor()
		return err
	}
	a.previews = pv
	a.parts = append(a.parts, pv.background)
	return a.start(context.WithoutCancel(ctx), a.janitor)
}

// shutdownExecutor shuts the embedded executor down, if there is one:
// its running programs may finish.
func (a *apiProcess) shutdownExecutor() { shutdownEmbedded(a.cfg.Config, a.ex) }

// serveStdio serves MCP on the process's stdin and stdout until the
// client goes or ctx ends.
func (a *apiProcess) serveStdio(ctx context.Context, opts APIOptions) error {
	a.log.Info("serving MCP on stdio", "embedded", a.rds.Embedded())
	err := a.mcp.SDK().Run(ctx, &mcpsdk.IOTransport{Reader: opts.Stdin, Writer: opts.Stdout})
	// The client went: its session ends with its executions.
	ectx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
	a.mcp.EndHeld(ectx)
	cancel()
	a.shutdownExecutor()
	if ctx.Err() != nil || errors.Is(err, io.EOF) {
		return nil
	}
	return err
}

// serveHTTP serves the API over HTTP until ctx ends, then drains it.
func (a *apiProcess) serveHTTP(ctx context.Context, opts APIOptions) error {
	cfg := a.cfg
	// Stopped after the HTTP server: it records the windows still open.
	if err := a.start(context.WithoutCancel(ctx), a.strangers); err != nil {
		a.shutdownExecutor()
		return err
	}
	handler := a.handler()
	srv := &http.Server{Handler: handler, ReadHeaderTimeout: api.ReadHeaderTimeout, ReadTimeout: api.ReadTimeout,
		IdleTimeout: api.IdleTimeout}
	ln, err := net.Listen("tcp", cfg.HTTPAddr)
	if err != nil {
		a.shutdownExecutor()
		return fmt.Errorf("listen on %s: %w", cfg.HTTPAddr, err)
	}
	printBanner(opts.Banner, cfg.Config, ln.Addr().String(), a.generated)
	a.log.Info("api listening", "addr", ln.Addr().String(), "embedded", a.rds.Embedded())
	if opts.Ready != nil {
		opts.Ready <- ln.Addr().String()
	}
	serveErr := make(chan error, 1)
	go func() { serveErr <- srv.Serve(ln) }()

	select {
	case err := <-serveErr:
		a.shutdownExecutor()
		return fmt.Errorf("http server: %w", err)
	case <-ctx.Done():
	}
	a.log.Info("shutting down")
	// Running programs may finish while the HTTP server drains: the clients
	// waiting for them get their results.
	var wg sync.WaitGroup
	wg.Go(a.shutdownExecutor)
	handler.Close()
	sctx, cancel := context.WithTimeout(context.Background(), cfg.ShutdownGrace+10*time.Second)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		a.log.Warn("http shutdown", "err", err)
	}
	wg.Wait()
	return nil
}

// handler is the API's HTTP handler over the parts.
func (a *apiProcess) handler() *api.Server {
	cfg := a.cfg
	return api.New(api.Options{
		Tokens:         auth.NewTokens(a.clients),
		Runs:           a.runs,
		Convs:          a.convs,
		MCP:            a.mcp,
		Files:          a.fileStore,
		Signer:         a.signer,
		Dashboard:      queue.Dashboard(a.rds.Conn, "/monitoring"),
		QueueMetrics:   queue.NewCollector(a.rds.Conn),
		Ready:          a.ready,
		MaxBody:        cfg.MaxMCPBody(),
		MaxUpload:      cfg.MaxUpload,
		BodyBudget:     cfg.BodyBudget,
		MetricsToken:   cfg.MetricsToken,
		Origins:        append([]string{cfg.Origin()}, cfg.AllowedOrigins...),
		Audit:          a.recorder,
		Refusals:       a.strangers,
		TrustedProxies: cfg.TrustedProxies,
		Registry:       a.registry,
		Logger:         a.log,
		Previews:       a.previews.service,
		PreviewRouter:  a.previews.router,
		Sessions:       a.sessions,
		Webhooks:       a.hooks,
		E2B:            a.e2b,
		InFlight:       a.inFlight,
	})
}

// shutdownEmbedded shuts an embedded executor down, if there is one.
func shutdownEmbedded(cfg *config.Config, ex *Executor) {
	if ex == nil {
		return
	}
	sctx, cancel := context.WithTimeout(context.Background(), cfg.ShutdownGrace+30*time.Second)
	defer cancel()
	ex.Shutdown(sctx)
}

// printBanner tells a new user where the service is and, when the token
// was generated, what it is and how to point an MCP client at it.
func printBanner(w io.Writer, cfg *config.Config, addr, token string) {
	if w == nil {
		return
	}
	base := cfg.PublicBaseURL
	fmt.Fprintf(w, "\nrunbox is running: %s (listening on %s)\n", base, addr)
	if token == "" {
		fmt.Fprintf(w, "API token: from MCP_API_TOKEN / MCP_API_TOKENS\n\n")
		return
	}
	cfgJSON, _ := json.MarshalIndent(map[string]any{"mcpServers": map[string]any{"runbox": map[string]any{
		"type": "http", "url": base + "/mcp", "headers": map[string]string{"Authorization": "Bearer " + token},
	}}}, "", "  ")
	fmt.Fprintf(w, "API token (generated; set MCP_API_TOKEN to choose your own): %s\n", token)
	fmt.Fprintf(w, "Playground: %s/   Dashboard: %s/monitoring/ (any user name, the token as password)\n", base, base)
	fmt.Fprintf(w, "Claude Code: claude mcp add --transport http runbox %s/mcp --header \"Authorization: Bearer %s\"\n", base, token)
	fmt.Fprintf(w, "MCP client config:\n%s\n\n", cfgJSON)
}
