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
	"github.com/runbox-dev/runbox/internal/executor"
	"github.com/runbox-dev/runbox/internal/files"
	"github.com/runbox-dev/runbox/internal/gitexport"
	"github.com/runbox-dev/runbox/internal/leader"
	"github.com/runbox-dev/runbox/internal/lifecycle"
	"github.com/runbox-dev/runbox/internal/mcp"
	"github.com/runbox-dev/runbox/internal/queue"
	"github.com/runbox-dev/runbox/internal/runs"
	"github.com/runbox-dev/runbox/internal/sessions"
	"github.com/runbox-dev/runbox/internal/store"
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
func RunAPI(ctx context.Context, cfg *config.Config, opts APIOptions) error {
	log := opts.Logger
	cs := cfg.Clients
	generated := ""
	if len(cs) == 0 {
		generated = "rb_" + rand.Text()
		var err error
		if cs, err = clients.Load(generated, "", ""); err != nil {
			return err
		}
	}

	rds, err := OpenRedis(ctx, cfg)
	if err != nil {
		return err
	}
	defer rds.Close()
	st := store.New(rds.Client)
	hub := store.NewHub(st, log)
	defer hub.Close()
	qc := queue.NewClient(rds.Client)
	sched := queue.NewScheduler(st, qc, log)
	secret, err := Secret(ctx, cfg, st)
	if err != nil {
		return err
	}
	signer := Signer(cfg, secret)
	ready := map[string]api.Check{"redis": func(ctx context.Context) error { return rds.Client.Ping(ctx).Err() }}
	// The api reads and writes conversations' files through the store: the
	// host folder the executors share, or a remote store.
	clock := clockwork.NewRealClock()
	elector := leader.NewElector(st, "api", clock, log)
	if err := elector.Start(context.WithoutCancel(ctx)); err != nil {
		return err
	}
	defer elector.Stop()
	var fileStore runbox.FileStore
	var janitor lifecycle.Group // the maintenance of the files: by the leader
	if cfg.FileStore != nil {
		s3, err := OpenS3(ctx, cfg)
		if err != nil {
			return err
		}
		fileStore = workcopy.NewVersioned(s3, st)
		ready["files"] = s3.Ping
		if cfg.FileRetention > 0 {
			janitor = append(janitor, conversations.NewExpiry(fileStore, st, cfg.FileRetention, clock, elector.Every, log))
		}
	} else {
		folders, err := Folders(cfg)
		if err != nil {
			return err
		}
		fileStore = files.NewHostStore(folders)
		janitor = append(janitor, conversations.NewJanitor(folders, st, cfg.SessionTTL, cfg.FileRetention, elector.Every, log))
	}

	registry := prometheus.NewRegistry()
	registry.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	var ex *Executor
	if rds.Embedded() {
		ex, err = StartExecutor(ctx, cfg, rds.Client, elector, registry, log, false)
		if err != nil {
			return err
		}
		defer ex.Close()
		ready["docker"] = ex.Sandboxes.Ping
	} else {
		// The leader runs the watchdog; the api takes part, so that lost
		// runs end even when no executor is left.
		wd := executor.NewWatchdog(st, sched, elector.Every, log)
		if err := wd.Start(context.WithoutCancel(ctx)); err != nil {
			return err
		}
		defer wd.Stop()
		ready["executors"] = func(ctx context.Context) error {
			infos, err := st.Executors(ctx)
			if err == nil && len(infos) == 0 {
				err = errors.New("no executor is running")
			}
			return err
		}
	}

	svc := runs.NewService(st, hub, sched, runs.Limits{
		MaxCodeBytes:             cfg.MaxCode,
		MaxTimeoutSeconds:        cfg.MaxTimeoutSeconds(),
		MaxCommandTimeoutSeconds: int(cfg.CommandTimeout / time.Second),
		MaxSessions:              cfg.MaxSessions,
		MaxStdinBytes:            maxStdin,
		MaxWaiting:               cfg.MaxQueuedPerConversation,
		ClientStorage:            fileStore.ClientUsage,
		EgressAllow:              cfg.Egress.Allow,
		EgressReachable:          cfg.EgressReachable(),
	}, log)
	svc.Metrics = clients.NewMetrics(registry)
	convs := conversations.NewService(fileStore, signer, svc, st, conversations.Limits{
		MaxUpload:           cfg.MaxUpload,
		MaxRead:             cfg.MaxRead,
		MaxInlineImages:     cfg.MaxInlineImages,
		MaxInlineImageBytes: cfg.MaxInlineImageBytes,
	})
	chain, err := AuditChain(cfg)
	if err != nil {
		return err
	}
	recorder := audit.NewRecorder(st, clock, log)
	sealer := audit.NewSealer(st, chain, cfg.AuditRetention, clock, log)
	if err := sealer.Start(context.WithoutCancel(ctx)); err != nil {
		return err
	}
	defer sealer.Stop()
	mcpServer := mcp.New(ctx, svc, convs, log)
	mcpServer.Audit = recorder
	// MCP sessions, and the commands tools whose executions they scope;
	// the leader ends the sessions idle past SANDBOX_SESSION_TTL.
	mcpSessions := sessions.New(st, cfg.SessionTTL, clock, log)
	mcpServer.Sessions = mcpSessions
	commands.Register(mcpServer, commands.New(svc, convs, st, mcpSessions, commands.Limits{
		TimeoutSeconds: int(cfg.CommandTimeout / time.Second), PerSession: cfg.MaxPerSession,
		Total: cfg.MaxConcurrent, MaxCommandBytes: cfg.MaxCode,
	}, log))
	sessionJanitor := sessions.NewJanitor(mcpSessions, elector.Every)
	if err := sessionJanitor.Start(context.WithoutCancel(ctx)); err != nil {
		return err
	}
	defer sessionJanitor.Stop()
	if cfg.Git != nil {
		git, err := gitexport.New(gitexport.Options{Git: cfg.Git, Files: fileStore, Audit: recorder, Clock: clock, Log: log})
		if err != nil {
			return err
		}
		// A token refused for its breadth stops the start; any other
		// problem is logged and shows in /readyz.
		if err := git.Start(ctx); err != nil {
			return err
		}
		gitexport.Register(mcpServer, git)
		ready["git"] = git.Ready
	}
	pv, err := startPreviews(ctx, cfg, previewDeps{store: st, secret: secret, executor: ex, mcp: mcpServer, runs: svc,
		convs: convs, ready: ready, elector: elector, clock: clock, secrets: []string{string(secret), generated},
		unserved: opts.Stdio && rds.Embedded(), log: log})
	if err != nil {
		shutdownEmbedded(cfg, ex)
		return err
	}
	defer pv.background.Stop()
	if err := janitor.Start(context.WithoutCancel(ctx)); err != nil {
		return err
	}
	defer janitor.Stop()

	shutdownExecutor := func() { shutdownEmbedded(cfg, ex) }

	if opts.Stdio {
		log.Info("serving MCP on stdio", "embedded", rds.Embedded())
		err := mcpServer.SDK().Run(ctx, &mcpsdk.IOTransport{Reader: opts.Stdin, Writer: opts.Stdout})
		// The client went: its session ends with its executions.
		ectx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Minute)
		mcpServer.EndHeld(ectx)
		cancel()
		shutdownExecutor()
		if ctx.Err() != nil || errors.Is(err, io.EOF) {
			return nil
		}
		return err
	}

	handler := api.New(api.Options{
		Tokens:        auth.NewTokens(cs),
		Runs:          svc,
		Convs:         convs,
		MCP:           mcpServer,
		Files:         fileStore,
		Signer:        signer,
		Redis:         rds.Client,
		Ready:         ready,
		MaxBody:       cfg.MaxMCPBody(),
		MaxUpload:     cfg.MaxUpload,
		BodyBudget:    cfg.BodyBudget,
		MetricsToken:  cfg.MetricsToken,
		Origins:       append([]string{cfg.Origin()}, cfg.AllowedOrigins...),
		Audit:         recorder,
		Registry:      registry,
		Logger:        log,
		Previews:      pv.service,
		PreviewRouter: pv.router,
		Sessions:      mcpSessions,
	})
	srv := &http.Server{Handler: handler, ReadHeaderTimeout: api.ReadHeaderTimeout, ReadTimeout: api.ReadTimeout,
		IdleTimeout: api.IdleTimeout}
	ln, err := net.Listen("tcp", cfg.HTTPAddr)
	if err != nil {
		shutdownExecutor()
		return fmt.Errorf("listen on %s: %w", cfg.HTTPAddr, err)
	}
	printBanner(opts.Banner, cfg, ln.Addr().String(), generated)
	log.Info("api listening", "addr", ln.Addr().String(), "embedded", rds.Embedded())
	if opts.Ready != nil {
		opts.Ready <- ln.Addr().String()
	}
	serveErr := make(chan error, 1)
	go func() { serveErr <- srv.Serve(ln) }()

	select {
	case err := <-serveErr:
		shutdownExecutor()
		return fmt.Errorf("http server: %w", err)
	case <-ctx.Done():
	}
	log.Info("shutting down")
	// Running programs may finish while the HTTP server drains: the clients
	// waiting for them get their results.
	var wg sync.WaitGroup
	wg.Go(shutdownExecutor)
	handler.Close()
	sctx, cancel := context.WithTimeout(context.Background(), cfg.ShutdownGrace+10*time.Second)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		log.Warn("http shutdown", "err", err)
	}
	wg.Wait()
	return nil
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
