// Package app wires the service's parts together from its configuration.
// cmd/api and cmd/executor are thin mains over it.
package app

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/alicebob/miniredis/v2"
	"github.com/hibiken/asynq"
	"github.com/jonboulle/clockwork"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/runbox-dev/runbox/internal/agent"
	"github.com/runbox-dev/runbox/internal/audit"
	"github.com/runbox-dev/runbox/internal/config"
	"github.com/runbox-dev/runbox/internal/conversations"
	"github.com/runbox-dev/runbox/internal/egress"
	"github.com/runbox-dev/runbox/internal/executor"
	"github.com/runbox-dev/runbox/internal/files"
	"github.com/runbox-dev/runbox/internal/leader"
	"github.com/runbox-dev/runbox/internal/lifecycle"
	"github.com/runbox-dev/runbox/internal/link"
	"github.com/runbox-dev/runbox/internal/queue"
	"github.com/runbox-dev/runbox/internal/s3store"
	"github.com/runbox-dev/runbox/internal/sandbox"
	"github.com/runbox-dev/runbox/internal/sandbox/docker"
	"github.com/runbox-dev/runbox/internal/sandbox/engine"
	"github.com/runbox-dev/runbox/internal/sandbox/kubernetes"
	"github.com/runbox-dev/runbox/internal/sandbox/runnerlist"
	"github.com/runbox-dev/runbox/internal/snapshot"
	"github.com/runbox-dev/runbox/internal/store"
	"github.com/runbox-dev/runbox/internal/store/auditlog"
	"github.com/runbox-dev/runbox/internal/workcopy"
)

// NewLogger returns the logger the configuration asks for, writing to w
// and, with SANDBOX_LOG_FILE, to that file too (appended to); close it
// when the process ends. It refuses an environment whose names runbox
// does not know (config.CheckNames), and logs a warning for those it
// only ignores.
func NewLogger(cfg *config.Config, environ []string, w io.Writer) (*slog.Logger, func(), error) {
	warnings, err := config.CheckNames(environ)
	if err != nil {
		return nil, nil, err
	}
	closeLog := func() {}
	if cfg.LogFile != "" {
		f, err := os.OpenFile(cfg.LogFile, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
		if err != nil {
			return nil, nil, fmt.Errorf("config: SANDBOX_LOG_FILE: %w", err)
		}
		w, closeLog = io.MultiWriter(w, f), func() { _ = f.Close() }
	}
	var level slog.Level
	_ = level.UnmarshalText([]byte(cfg.LogLevel))
	opts := &slog.HandlerOptions{Level: level}
	var log *slog.Logger
	if cfg.LogFormat == "json" {
		log = slog.New(slog.NewJSONHandler(w, opts))
	} else {
		log = slog.New(slog.NewTextHandler(w, opts))
	}
	for _, w := range warnings {
		log.Warn("config: " + w)
	}
	return log, closeLog, nil
}

// RouteRedisLogs sends the Redis client's own messages (reconnects, dial
// failures) to log at debug level. Call it once, from main.
func RouteRedisLogs(log *slog.Logger) { store.RouteLogs(log) }

// Redis is the connection to the shared Redis, real or embedded.
type Redis struct {
	URL      string
	Conn     *store.Conn
	embedded *miniredis.Miniredis
	stopTick func()
}

// Embedded reports whether this Redis lives in this process.
func (r *Redis) Embedded() bool { return r.embedded != nil }

// Close closes the connection and stops an embedded server.
func (r *Redis) Close() {
	_ = r.Conn.Close()
	if r.embedded != nil {
		r.stopTick()
		r.embedded.Close()
	}
}

// OpenRedis connects to REDIS_URL, or with no URL starts an embedded
// Redis on loopback.
func OpenRedis(ctx context.Context, cfg *config.Config) (*Redis, error) {
	r := &Redis{URL: cfg.RedisURL}
	if r.URL == "" {
		mr := miniredis.NewMiniRedis()
		if err := mr.StartAddr("127.0.0.1:0"); err != nil {
			return nil, fmt.Errorf("start embedded redis: %w", err)
		}
		r.embedded, r.URL = mr, "redis://"+mr.Addr()+"/0"
		// miniredis's TTLs do not count down by themselves.
		tick := &lifecycle.Base{}
		_ = tick.Run(context.Background(), lifecycle.Every(clockwork.NewRealClock(), time.Second,
			func(context.Context) { mr.FastForward(time.Second) }))
		r.stopTick = tick.Stop
	}
	// asynq's parser, so that runbox and asynq read REDIS_URL alike:
	// redis://, rediss:// and redis-sentinel://[:pw@]h1:p1,h2:p2?master=m.
	opt, err := asynq.ParseRedisURI(r.URL)
	if err != nil {
		return nil, fmt.Errorf("config: REDIS_URL: %w", err)
	}
	if r.Conn, err = store.Connect(opt); err != nil {
		return nil, fmt.Errorf("config: REDIS_URL: %w", err)
	}
	pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := r.Conn.Ping(pctx); err != nil {
		r.Close()
		return nil, fmt.Errorf("redis at %s is not reachable: %w", redactURL(r.URL), err)
	}
	return r, nil
}

// redactURL drops the password of a URL for messages.
func redactURL(u string) string {
	if at := strings.LastIndex(u, "@"); at >= 0 {
		if scheme := strings.Index(u, "://"); scheme >= 0 && scheme < at {
			return u[:scheme+3] + "…" + u[at:]
		}
	}
	return u
}

// Folders opens the conversation folders on this host: the file store
// itself, or the executor's working copies of a remote one.
func Folders(cfg *config.Config) (*files.Folders, error) {
	return files.NewFolders(cfg.SandboxRoot, files.Options{
		UID: sandbox.UID, GID: sandbox.GID, Quota: cfg.QuotaBytes, Files: cfg.QuotaFiles,
		Mode: files.QuotaMode(cfg.QuotaMode),
	})
}

// Secret returns the secret every process of the deployment shares:
// FILE_SECRET, or else one made once that survives a restart — beside the
// conversations in SANDBOX_ROOT, or in Redis with a remote file store
// (processes then share no folder). Download links are signed with it;
// the keys of preview capabilities and of the api's link to executors are
// derived from it.
func Secret(ctx context.Context, cfg *config.Config, st *store.Conversations) ([]byte, error) {
	switch {
	case len(cfg.FileSecret) > 0:
		return cfg.FileSecret, nil
	case cfg.FileStore != nil:
		return st.FileSecret(ctx, func() []byte { return []byte(rand.Text() + rand.Text()) })
	default:
		return files.LoadOrCreateSecret(filepath.Join(cfg.SandboxRoot, ".file-secret"))
	}
}

// Signer returns the signer of download links, with the shared secret.
func Signer(cfg *config.Config, secret []byte) *files.Signer {
	return files.NewSigner(secret, cfg.PublicBaseURL, cfg.FileURLTTL)
}

// OpenS3 connects to the remote file store FILE_STORE names.
func OpenS3(ctx context.Context, cfg *config.Config) (*s3store.Store, error) {
	octx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	fs := cfg.FileStore
	return s3store.Open(octx, &s3store.Options{Bucket: fs.Bucket, Prefix: fs.Prefix, Endpoint: fs.Endpoint, Region: fs.Region,
		AccessKey: fs.AccessKey, SecretKey: fs.SecretKey, SessionToken: fs.SessionToken}, cfg.QuotaBytes)
}

// Executor is an executor and what it holds open.
type Executor struct {
	*executor.Executor
	Sandboxes *sandbox.Manager
	engine    sandboxEngine
	// background are the janitor of the working copies (with a remote
	// file store) and the link server (standalone).
	background lifecycle.Group
}

// Close releases the executor's connections. Shut it down first.
func (e *Executor) Close() {
	e.background.Stop()
	_ = e.engine.Close()
}

// StartExecutor connects to Docker and starts an executor on conn, the
// process's one Redis connection (the store's, asynq's and the queue's). The
// deployment's maintenance runs while elector, the process's, leads. A
// standalone executor serves the api's link to its sandboxes; an embedded
// one is called in its process.
func StartExecutor(ctx context.Context, cfg *Config, conn *store.Conn, elector *leader.Elector,
	metrics prometheus.Registerer, log *slog.Logger, standalone bool) (_ *Executor, err error) {
	st := store.New(conn)
	engine, err := openEngine(ctx, cfg.Config, log)
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			engine.Close()
		}
	}()
	folders, err := Folders(cfg.Config)
	if err != nil {
		return nil, err
	}
	secret, err := Secret(ctx, cfg.Config, st.Conversations)
	if err != nil {
		return nil, err
	}
	copies, stateBlobs, err := workingCopies(ctx, cfg.Config, folders, st.Conversations, log)
	if err != nil {
		return nil, err
	}
	pool, err := sandbox.ParseWarmLimits(cfg.Pool)
	if err != nil {
		return nil, fmt.Errorf("config: SANDBOX_POOL: %w", err)
	}
	proxy, err := egressProxy(cfg, secret, log)
	if err != nil {
		return nil, err
	}
	state := snapshot.NewKeeper(stateBlobs, st.Conversations, secret, log.With("component", "snapshot"))
	sandboxes, err := sandboxManager(ctx, cfg.Config, st, engine, folders, proxy, state, log)
	if err != nil {
		return nil, err
	}
	linkListener, linkAddr, err := executorLink(cfg.Config, standalone)
	if err != nil {
		return nil, err
	}
	qc := queue.NewClient(conn)
	ex := executor.New(executor.Config{
		ID:            cfg.ExecutorID,
		Concurrency:   cfg.Concurrency,
		MaxOutput:     cfg.MaxOutput,
		ShutdownGrace: cfg.ShutdownGrace,
		PollInterval:  cfg.PollInterval,
		Metrics:       metrics,
		Pool:          pool,
		OwnerTTL:      cfg.SessionTTL,
		Copies:        copies,
		Schedule:      elector.Every,
		MaxDetached:   cfg.MaxDetached,
		Egress: &executor.Egress{Proxy: proxy, PipIndexURL: cfg.PipIndexURL, NPMRegistry: cfg.NPMRegistry,
			Audit: audit.NewRecorder(auditlog.New(conn), clockwork.NewRealClock(), log), Secrets: cfg.EgressPolicy.Secrets},
		ServerIdle: cfg.ServerTTL,
		LinkAddr:   linkAddr,
		QuotaFiles: cfg.QuotaFiles,
	}, queue.NewWorker(conn, cfg.ExecutorID, log.With("executor", cfg.ExecutorID)), st, queue.NewScheduler(st, qc, log), sandboxes, folders, Signer(cfg.Config, secret), log)
	if err := ex.Start(ctx); err != nil {
		if linkListener != nil {
			linkListener.Close()
		}
		return nil, err
	}
	background := executorBackground(cfg.Config, st, folders, copies, linkListener, secret, ex, log)
	if err := background.Start(context.WithoutCancel(ctx)); err != nil {
		ex.Shutdown(ctx)
		return nil, err
	}
	return &Executor{Executor: ex, Sandboxes: sandboxes, engine: engine, background: background}, nil
}

// executorLink listens where the api reaches a standalone executor's
// sandboxes (package link); an executor in the api's process needs none.
func executorLink(cfg *config.Config, standalone bool) (net.Listener, string, error) {
	if !standalone {
		return nil, "", nil
	}
	l, addr, err := link.Listen(cfg.LinkAddr, cfg.LinkAdvertise)
	if err != nil {
		return nil, "", fmt.Errorf("config: EXECUTOR_LINK_ADDR: %w", err)
	}
	return l, addr, nil
}

// workingCopies are the executor's copies of the conversations of a
// remote file store (FILE_STORE); none without one.
//
// Kept interpreters' saved state (snapshot.Blobs) goes to the
// conversations' storage: the bucket with a remote file store (any
// executor may take a conversation up), through the working copies, which
// hold its room, else the host folder.
func workingCopies(ctx context.Context, cfg *config.Config, folders *files.Folders, st *store.Conversations,
	log *slog.Logger) (*workcopy.Copies, snapshot.Blobs, error) {
	if cfg.FileStore == nil {
		return nil, folders, nil
	}
	s3, err := OpenS3(ctx, cfg)
	if err != nil {
		return nil, nil, err
	}
	copies := workcopy.New(s3, folders, st, sandbox.UID, sandbox.GID, log)
	return copies, copies, nil
}

// egressProxy is the proxy the connections programs make to their
// sandbox's proxy listener come to, with the run their sandbox runs.
func egressProxy(cfg *Config, secret []byte, log *slog.Logger) (*egress.Proxy, error) {
	// The CA of the secrets' domains is the deployment's: derived from
	// its shared secret, the same on every executor, stored nowhere.
	var ca *egress.CA
	policy := cfg.EgressPolicy
	if len(policy.Secrets) > 0 {
		var err error
		if ca, err = egress.NewCA(secret, policy.Secrets.Domains(), nil); err != nil {
			return nil, err
		}
	}
	return egress.New(egress.Settings{Hosts: policy.Hosts, Deny: policy.Deny, MaxBytes: cfg.Egress.MaxBytes,
		MaxConnections: cfg.Egress.MaxConnections, ConnectTimeout: cfg.Egress.ConnectTimeout,
		IdleTimeout: cfg.Egress.IdleTimeout, CA: ca, UpstreamRoots: cfg.Egress.UpstreamRoots, Logger: log}), nil
}

// sandboxEngine is the engine of an executor's sandboxes, which says what
// its sandboxes can do and which the executor closes when it goes.
type sandboxEngine interface {
	sandbox.Engine
	Capabilities() engine.Capabilities
	Close() error
}

// openEngine opens the engine SANDBOX_ENGINE names: the Docker Engine of
// this host, or the Kubernetes cluster of KUBECONFIG (or the executor's
// own pod's). Here alone is the engine's name read: what differs between
// engines afterwards, the engine says (Capabilities).
func openEngine(ctx context.Context, cfg *config.Config, log *slog.Logger) (sandboxEngine, error) {
	open := map[string]func(context.Context, *config.Config, *slog.Logger) (sandboxEngine, error){
		"docker":     openDocker,
		"kubernetes": openKubernetes,
	}[cfg.Engine]
	if open == nil {
		return nil, fmt.Errorf("config: SANDBOX_ENGINE %q names no engine", cfg.Engine)
	}
	return open(ctx, cfg, log)
}

// openDocker opens the Docker Engine of this host.
func openDocker(ctx context.Context, cfg *config.Config, _ *slog.Logger) (sandboxEngine, error) {
	return docker.Open(ctx, docker.Options{Runtime: docker.RuntimeFor(cfg.Runtime)})
}

// openKubernetes opens the Kubernetes cluster of KUBECONFIG, or the
// executor's own pod's.
func openKubernetes(ctx context.Context, cfg *config.Config, log *slog.Logger) (sandboxEngine, error) {
	k := cfg.Kubernetes
	// A cluster lists no images with their labels: the runner images are
	// those of the list the build wrote (package runnerlist says why).
	if k.RunnersFile == "" {
		return nil, errors.New("config: SANDBOX_ENGINE=kubernetes needs SANDBOX_RUNNERS_FILE, the runner images' list (docs/kubernetes.md)")
	}
	runners, err := runnerlist.Load(k.RunnersFile)
	if err != nil {
		return nil, err
	}
	kubernetes.RouteClientLogs(log)
	pods, err := kubernetes.Open(ctx, k.Kubeconfig, k.Namespace, k.RuntimeClass)
	if err != nil {
		return nil, err
	}
	// A pod shares no folder the executor could measure as its runs go,
	// nor sets a ulimit: its agent holds it to the quota (package agent).
	pods.Quota = agent.Quota{Bytes: cfg.QuotaBytes, Entries: cfg.QuotaFiles}
	pods.ImageList = runners.Images
	log.Info("runner images from a list", "file", k.RunnersFile, "images", len(runners))
	return pods, nil
}

// sandboxManager is the manager of the executor's sandboxes on engine.
func sandboxManager(ctx context.Context, cfg *config.Config, st *store.Store, eng sandboxEngine, folders *files.Folders,
	proxy *egress.Proxy, state sandbox.StateKeeper, log *slog.Logger) (*sandbox.Manager, error) {
	warm, err := sandbox.ParseWarmLimits(cfg.MaxWarm)
	if err != nil {
		return nil, fmt.Errorf("config: SANDBOX_MAX_WARM: %w", err)
	}
	deployment, err := st.Executors.Deployment(ctx)
	if err != nil {
		return nil, err
	}
	caps := eng.Capabilities()
	var recycle func(string, func(string) bool, time.Time) (string, error)
	var sockets string
	if caps.HostFolders {
		// Idle sandboxes evicted from their conversations are reset and
		// join the pool for new ones, rather than being removed, when
		// their folder can be handed over (files.Folders.Recycle).
		recycle = func(cid string, mounted func(string) bool, idleSince time.Time) (string, error) {
			return folders.Recycle(cid, executor.NewSlotName(cfg.ExecutorID), mounted, idleSince)
		}
		// Beside the conversations, which the sandboxes mount from this
		// host too. Without it, egress comes over the agent's stream.
		sockets = filepath.Join(cfg.SandboxRoot, ".sockets", cfg.ExecutorID)
	}
	// Pooled sandboxes that wait on this host may take, at their memory
	// limit, half of what it has available now.
	var poolMemory int64
	if caps.HostMemory {
		poolMemory = availableMemory() / 2
	}
	return sandbox.NewManager(eng, sandbox.Options{
		ExecutorID: cfg.ExecutorID,
		Deployment: deployment,
		Limits: sandbox.Limits{Memory: cfg.MemoryLimit, NanoCPUs: cfg.NanoCPUs, Pids: cfg.PidsLimit,
			FileSize: cfg.QuotaBytes},
		Logger:     log.With("component", "sandbox"),
		IdleTTL:    cfg.SessionTTL,
		MaxWarm:    warm,
		ImageTag:   cfg.RunnerTag,
		Recycle:    recycle,
		MaxPool:    sandbox.WarmLimits{Default: executor.MaxPool},
		PoolMemory: poolMemory,
		Inbound:    func(in sandbox.Inbound) { proxy.Serve(in.RunID, in.Conn) },
		Sockets:    sockets,
		State:      state,
	}), nil
}

// executorBackground are the parts an executor runs beside itself: the
// janitor of the working copies (with a remote file store) and the link
// server (standalone, on ln).
func executorBackground(cfg *config.Config, st *store.Store, folders *files.Folders, copies *workcopy.Copies,
	ln net.Listener, secret []byte, ex *executor.Executor, log *slog.Logger) lifecycle.Group {
	var background lifecycle.Group
	if copies != nil {
		// A working copy whose conversation went idle is removed here (the
		// store keeps the files); its next run here fetches it again. Every
		// executor sweeps its own.
		janitor := conversations.NewJanitor(folders, st.Conversations, cfg.SessionTTL, 2*cfg.SessionTTL,
			lifecycle.Periodic(clockwork.NewRealClock()), log)
		janitor.BeforeRemove(copies.Forget)
		background = append(background, janitor)
	}
	if ln != nil {
		background = append(background, link.NewServer(link.ServerOptions{Listener: ln, Key: link.Key(secret),
			Backend: ex, Logger: log.With("component", "link")}))
	}
	return background
}
