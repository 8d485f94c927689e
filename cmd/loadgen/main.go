// Command loadgen pushes runs at a running runbox over MCP and reports
// throughput, latency percentiles and errors.
//
//	loadgen -url http://localhost:8080 -token <token> -runs 2000 -clients 32 -conversations 32
package main

import (
	"context"
	"crypto/rand"
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/runbox-dev/runbox/internal/bench"
)

func main() {
	url := flag.String("url", "http://localhost:8080", "runbox base URL")
	token := flag.String("token", os.Getenv("MCP_API_TOKEN"), "API token (default $MCP_API_TOKEN)")
	runs := flag.Int("runs", 400, "runs in all")
	clients := flag.Int("clients", 16, "concurrent clients, each with its own MCP session")
	convs := flag.Int("conversations", 16, "conversations the clients share")
	lang := flag.String("language", "python", "language")
	code := flag.String("code", "print(1)", "program")
	timeout := flag.Duration("timeout", 10*time.Minute, "give up after")
	flag.Parse()

	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	res, err := bench.Load(ctx, bench.Client{URL: strings.TrimRight(*url, "/"), Token: *token}, bench.LoadConfig{
		Runs: *runs, Conversations: *convs, Clients: *clients, Language: *lang, Code: *code,
		Prefix: "load-" + strings.ToLower(rand.Text()[:6]),
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, "loadgen:", err)
		os.Exit(1)
	}
	l := res.Latency
	fmt.Printf("runs %d in %.2fs: %.1f runs/s, %d errors\n", res.Runs, res.Elapsed.Seconds(), res.Throughput(), res.Errors)
	fmt.Printf("latency p50 %v  p90 %v  p99 %v  min %v  max %v\n", ms(l.Median), ms(l.P90), ms(l.P99), ms(l.Min), ms(l.Max))
	if res.Errors > 0 {
		fmt.Printf("first error: %s\n", res.FirstError)
		os.Exit(1)
	}
}

func ms(d time.Duration) string { return fmt.Sprintf("%.1fms", float64(d)/float64(time.Millisecond)) }
