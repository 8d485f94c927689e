// Command executor takes runs off the queue in Redis and runs them in
// Docker sandboxes. Any number of executors may share one Redis (and one
// SANDBOX_ROOT).
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/runbox-dev/runbox/internal/app"
	"github.com/runbox-dev/runbox/internal/config"
	"github.com/runbox-dev/runbox/internal/store"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "executor:", err)
		os.Exit(1)
	}
}

func run() error {
	cfg, err := config.FromEnv(os.Getenv)
	if err != nil {
		return err
	}
	if cfg.RedisURL == "" {
		return errors.New("config: REDIS_URL is required: a standalone executor shares Redis with api")
	}
	log := app.NewLogger(cfg, os.Stderr)
	app.RouteRedisLogs(log)
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	rds, err := app.OpenRedis(ctx, cfg)
	if err != nil {
		return err
	}
	defer rds.Close()
	ex, err := app.StartExecutor(ctx, cfg, rds.URL, store.New(rds.Client), log)
	if err != nil {
		return err
	}
	defer ex.Close()
	<-ctx.Done()
	stop()
	log.Info("shutting down", "grace", cfg.ShutdownGrace)
	ex.Shutdown(context.Background())
	return nil
}
