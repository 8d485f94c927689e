// Command runbox-envd is runbox's E2B sandbox daemon (package
// internal/e2b/envd). It is baked into the runner images and started as
// an E2B sandbox's background program; it serves on the sandbox's
// loopback, where the api reaches it through the executor's link.
//
// Usage: runbox-envd [-addr 127.0.0.1:49983] [-home /home/user] [-data /data] [-user user]
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/runbox-dev/runbox/internal/e2b/envd"
)

func main() {
	addr := flag.String("addr", "127.0.0.1:49983", "where to listen")
	home := flag.String("home", "/home/user", "the user's home as clients name it")
	data := flag.String("data", "/data", "the real folder the home leads to")
	user := flag.String("user", "user", "the sandbox's user's name")
	flag.Parse()
	// Files and folders come out 0644 and 0755, as in E2B's sandboxes.
	syscall.Umask(0o022)
	srv := envd.New(envd.Config{Home: *home, Data: *data, User: *user,
		Env: environment(os.Environ(), *home, *user)})
	if err := serve(*addr, srv); err != nil {
		fmt.Fprintln(os.Stderr, "runbox-envd:", err)
		os.Exit(1)
	}
}

// environment is what processes start with: the daemon's own (the run's:
// PATH, the proxy, the sandbox's variables), as the user at home.
func environment(env []string, home, user string) []string {
	out := make([]string, 0, len(env)+5)
	for _, kv := range env {
		switch k, _, _ := strings.Cut(kv, "="); k {
		case "HOME", "USER", "LOGNAME", "SHELL", "PWD", "OLDPWD":
		default:
			out = append(out, kv)
		}
	}
	return append(out, "HOME="+home, "USER="+user, "LOGNAME="+user, "SHELL=/bin/bash")
}

// serve serves srv on addr until SIGTERM or SIGINT, then ends what it
// started.
func serve(addr string, srv *envd.Server) error {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return err
	}
	hs := &http.Server{Handler: srv, ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 2 * time.Minute}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, os.Interrupt)
	defer stop()
	go func() {
		<-ctx.Done()
		srv.Close()
		sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = hs.Shutdown(sctx)
	}()
	if err := hs.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}
