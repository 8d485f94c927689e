// Command api serves the code execution service: MCP (Streamable HTTP at
// /mcp, HTTP+SSE at /mcp/events, or stdio with --stdio), the REST API,
// signed downloads, the playground and the queue dashboard. Without
// REDIS_URL it embeds Redis and an executor, so that it needs nothing but
// Docker.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/runbox-dev/runbox/internal/app"
)

func main() {
	if len(os.Args) > 1 && os.Args[1] == "audit" {
		os.Exit(audit(os.Args[2:]))
	}
	stdio := flag.Bool("stdio", false, "serve MCP on stdin and stdout instead of HTTP")
	flag.Parse()
	if err := run(*stdio); err != nil {
		fmt.Fprintln(os.Stderr, "api:", err)
		os.Exit(1)
	}
}

func run(stdio bool) error {
	cfg, err := app.Load(os.Getenv)
	if err != nil {
		return err
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	log, closeLog, err := app.NewLogger(cfg.Config, os.Environ(), os.Stderr)
	if err != nil {
		return err
	}
	defer closeLog()
	app.RouteRedisLogs(log)
	return app.RunAPI(ctx, cfg, app.APIOptions{
		Stdio:  stdio,
		Stdin:  os.Stdin,
		Stdout: os.Stdout,
		Banner: os.Stderr,
		Logger: log,
	})
}

// audit runs `api audit export|verify` with the api's configuration.
func audit(args []string) int {
	cfg, err := app.Load(os.Getenv)
	if err != nil {
		fmt.Fprintln(os.Stderr, "api:", err)
		return 2
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	return app.RunAudit(ctx, cfg.Config, args, os.Stdout, os.Stderr)
}
