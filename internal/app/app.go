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
	"github.com/moby/moby/client"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"

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
	"github.com/runbox-dev/runbox/internal/store"
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

// RouteRedisLogs sends go-redis's own messages (reconnects, dial
// failures), which it writes to stderr by default, to log at debug level.
// go-redis keeps its logger in a package variable: call this once, from
// main.
func RouteRedisLogs(log *slog.Logger) { redis.SetLogger(redisLogger{log}) }

type redisLogger struct{ log *slog.Logger }

func (l redisLogger) Printf(ctx context.Context, format string, v ...any) {
	l.log.DebugContext(ctx, "redis: "+fmt.Sprintf(format, v...))
}

// Redis is the connection to the shared Redis, real or embedded.
type Redis struct {
	URL      string
	Client   redis.UniversalClient
	embedded *miniredis.Miniredis
	stopTick func()
}

// Embedded reports whether this Redis lives in this process.
func (r *Redis) Embedded() bool { return r.embedded != nil }

// Close closes the connection and stops an embedded server.
func (r *Redis) Close() {
	_ = r.Client.Close()
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
	client, ok := opt.MakeRedisClient().(redis.UniversalClient)
	if !ok {
		return nil, errors.New("config: REDIS_URL: not a Redis client this service can use")
	}
	r.Client = client
	pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := r.Client.Ping(pctx).Err(); err != nil {
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

// OpenDocker connects to the Docker Engine and checks that it answers.
func OpenDocker(ctx context.Context) (*client.Client, error) {
	c, err := client.New(client.FromEnv)
	if err != nil {
		return nil, fmt.Errorf("docker: %w", err)
	}
	pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if _, err := c.Ping(pctx, client.PingOptions{NegotiateAPIVersion: true}); err != nil {
		c.Close()
		return nil, fmt.Errorf("the Docker Engine is not reachable (is it running, and may this user use it?): %w", err)
	}
	return c, nil
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
func Secret(ctx context.Context, cfg *config.Config, st *store.Store) ([]byte, error) {
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
	return s3store.Open(octx, cfg.FileStore, cfg.QuotaBytes)
}

// Executor is an executor and what it holds open.
type Executor struct {
	*executor.Executor
	Sandboxes *sandbox.Manager
	docker    *client.Client
	// background are the janitor of the working copies (with a remote
	// file store) and the link server (standalone).
	background lifecycle.Group
}

// Close releases the executor's connections. Shut it down first.
func (e *Executor) Close() {
	e.background.Stop()
	_ = e.docker.Close()
}

// StartExecutor connects to Docker and starts an executor on rdb, the
// process's one Redis client (the store's, asynq's and the queue's). The
// deployment's maintenance runs while elector, the process's, leads. A
// standalone executor serves the api's link to its sandboxes; an embedded
// one is called in its process.
func StartExecutor(ctx context.Context, cfg *config.Config, rdb redis.UniversalClient, elector *leader.Elector,
	metrics prometheus.Registerer, log *slog.Logger, standalone bool) (*Executor, error) {
	st := store.New(rdb)
	docker, err := OpenDocker(ctx)
	if err != nil {
		return nil, err
	}
	folders, err := Folders(cfg)
	if err != nil {
		docker.Close()
		return nil, err
	}
	secret, err := Secret(ctx, cfg, st)
	if err != nil {
		docker.Close()
		return nil, err
	}
	signer := Signer(cfg, secret)
	var copies *workcopy.Copies
	if cfg.FileStore != nil {
		s3, err := OpenS3(ctx, cfg)
		if err != nil {
			docker.Close()
			return nil, err
		}
		copies = workcopy.New(s3, folders, st, sandbox.UID, sandbox.GID, log)
	}
	warm, err := sandbox.ParseWarmLimits(cfg.MaxWarm)
	if err != nil {
		docker.Close()
		return nil, fmt.Errorf("config: SANDBOX_MAX_WARM: %w", err)
	}
	pool, err := sandbox.ParseWarmLimits(cfg.Pool)
	if err != nil {
		docker.Close()
		return nil, fmt.Errorf("config: SANDBOX_POOL: %w", err)
	}
	deployment, err := st.Deployment(ctx)
	if err != nil {
		docker.Close()
		return nil, err
	}
	// Idle sandboxes evicted from their conversations are reset and join
	// the pool for new ones, rather than being removed, when their folder
	// can be handed over (files.Folders.Recycle).
	recycle := func(cid string, mounted func(string) bool, idleSince time.Time) (string, error) {
		return folders.Recycle(cid, executor.NewSlotName(cfg.ExecutorID), mounted, idleSince)
	}
	// Connections programs make to their sandbox's proxy listener come to
	// the egress proxy with the run their sandbox runs.
	proxy := egress.New(egress.Settings{Hosts: cfg.Egress.Hosts, MaxBytes: cfg.Egress.MaxBytes,
		MaxConnections: cfg.Egress.MaxConnections, ConnectTimeout: cfg.Egress.ConnectTimeout,
		IdleTimeout: cfg.Egress.IdleTimeout, Logger: log})
	sandboxes := sandbox.NewManager(docker, sandbox.Options{
		ExecutorID: cfg.ExecutorID,
		Deployment: deployment,
		Limits: sandbox.Limits{Memory: cfg.MemoryLimit, NanoCPUs: cfg.NanoCPUs, Pids: cfg.PidsLimit,
			FileSize: cfg.QuotaBytes},
		Logger:   log.With("component", "sandbox"),
		IdleTTL:  cfg.SessionTTL,
		MaxWarm:  warm,
		ImageTag: cfg.RunnerTag,
		Runtime:  sandbox.RuntimeFor(cfg.Runtime),
		Recycle:  recycle,
		MaxPool:  sandbox.WarmLimits{Default: executor.MaxPool},
		Inbound:  func(in sandbox.Inbound) { proxy.Serve(in.RunID, in.Conn) },
		// Beside the conversations, which are on the Docker host too:
		// the sandboxes mount them.
		Sockets: filepath.Join(cfg.SandboxRoot, ".sockets", cfg.ExecutorID),
	})
	var (
		linkListener net.Listener
		linkAddr     string
	)
	if standalone {
		if linkListener, linkAddr, err = link.Listen(cfg.LinkAddr, cfg.LinkAdvertise); err != nil {
			docker.Close()
			return nil, fmt.Errorf("config: EXECUTOR_LINK_ADDR: %w", err)
		}
	}
	qc := queue.NewClient(rdb)
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
			Audit: audit.NewRecorder(st, clockwork.NewRealClock(), log)},
		ServerIdle: cfg.ServerTTL,
		LinkAddr:   linkAddr,
	}, rdb, st, queue.NewScheduler(st, qc, log), sandboxes, folders, signer, log)
	if err := ex.Start(ctx); err != nil {
		if linkListener != nil {
			linkListener.Close()
		}
		docker.Close()
		return nil, err
	}
	var background lifecycle.Group
	if copies != nil {
		// A working copy whose conversation went idle is removed here (the
		// store keeps the files); its next run here fetches it again. Every
		// executor sweeps its own.
		janitor := conversations.NewJanitor(folders, st, cfg.SessionTTL, 2*cfg.SessionTTL,
			lifecycle.Periodic(clockwork.NewRealClock()), log)
		janitor.BeforeRemove(copies.Forget)
		background = append(background, janitor)
	}
	if linkListener != nil {
		background = append(background, link.NewServer(link.ServerOptions{Listener: linkListener, Key: link.Key(secret),
			Backend: ex, Logger: log.With("component", "link")}))
	}
	if err := background.Start(context.WithoutCancel(ctx)); err != nil {
		ex.Shutdown(ctx)
		docker.Close()
		return nil, err
	}
	return &Executor{Executor: ex, Sandboxes: sandboxes, docker: docker, background: background}, nil
}
