// Command executor takes runs off the queue in Redis and runs them in
// Docker sandboxes. Any number of executors may share one Redis (and one
// SANDBOX_ROOT).
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/runbox-dev/runbox/internal/app"
	"github.com/runbox-dev/runbox/internal/leader"
	"github.com/runbox-dev/runbox/internal/store"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "executor:", err)
		os.Exit(1)
	}
}

func run() error {
	cfg, err := app.Load(os.Getenv)
	if err != nil {
		return err
	}
	if cfg.RedisURL == "" {
		return errors.New("config: REDIS_URL is required: a standalone executor shares Redis with api")
	}
	log, closeLog, err := app.NewLogger(cfg.Config, os.Environ(), os.Stderr)
	if err != nil {
		return err
	}
	defer closeLog()
	app.RouteRedisLogs(log)
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	rds, err := app.OpenRedis(ctx, cfg.Config)
	if err != nil {
		return err
	}
	defer rds.Close()
	registry := prometheus.NewRegistry()
	registry.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	// Every command's reply is watched for Redis refusing writes.
	writes := rds.Conn.WatchWrites(registry, log)
	// What runs cost in waits on Redis (make bench reads it).
	rds.Conn.CountRoundTrips(registry)
	elector := leader.NewElector(store.New(rds.Conn), "executor-"+cfg.ExecutorID, clockwork.NewRealClock(), log)
	if err := elector.Start(context.WithoutCancel(ctx)); err != nil {
		return err
	}
	defer elector.Stop()
	ex, err := app.StartExecutor(ctx, cfg, rds.Conn, elector, registry, log, true)
	if err != nil {
		return err
	}
	defer ex.Close()
	if cfg.MetricsAddr != "" {
		srv := &http.Server{Addr: cfg.MetricsAddr, Handler: monitor(registry, func(ctx context.Context) error {
			return writes.Check(ctx)
		}), ReadHeaderTimeout: 10 * time.Second}
		go func() {
			if err := srv.ListenAndServe(); err != nil && !errors.Is(err, http.ErrServerClosed) {
				log.Error("metrics server", "err", err)
			}
		}()
		defer srv.Close()
	}
	<-ctx.Done()
	stop()
	log.Info("shutting down", "grace", cfg.ShutdownGrace)
	ex.Shutdown(context.Background())
	return nil
}

// monitor serves /metrics, and /healthz and /readyz: ready while Redis
// answers and accepts writes.
func monitor(registry *prometheus.Registry, redisReady func(context.Context) error) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(registry, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"status":"ok"}`)
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), 3*time.Second)
		defer cancel()
		w.Header().Set("Content-Type", "application/json")
		if err := redisReady(ctx); err != nil {
			w.WriteHeader(http.StatusServiceUnavailable)
			io.WriteString(w, `{"redis":"unavailable"}`)
			return
		}
		io.WriteString(w, `{"redis":"ok"}`)
	})
	return mux
}
