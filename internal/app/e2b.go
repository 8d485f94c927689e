package app

import (
	"context"
	"time"

	"github.com/runbox-dev/runbox/internal/api"
	"github.com/runbox-dev/runbox/internal/auth"
	"github.com/runbox-dev/runbox/internal/clients"
	"github.com/runbox-dev/runbox/internal/e2b"
	"github.com/runbox-dev/runbox/internal/e2b/interp"
	"github.com/runbox-dev/runbox/internal/runs"
)

// startE2B builds runbox's E2B-compatible API (served under /e2b and on
// the preview domain's <port>-<sandbox id> hosts) and starts the sweeper
// that ends its sandboxes at their timeouts.
func (a *apiProcess) startE2B(ctx context.Context) error {
	cfg := a.cfg
	domain := ""
	if !a.unserved {
		domain = a.previews.service.Domain().String()
	}
	byName := map[string]clients.Client{}
	for _, c := range a.clients {
		byName[c.Name] = c
	}
	svc := e2b.New(e2b.Options{
		Store: a.st, Runs: a.runs, Convs: a.convs, Link: a.previews.link, Secret: a.secret, Domain: domain,
		Clients: func(name string) (clients.Client, bool) { c, ok := byName[name]; return c, ok },
		Limits: e2b.Limits{MaxTimeout: runs.MaxBackground, MaxUpload: cfg.MaxUpload,
			KeepAlive: max(cfg.ServerTTL/4, time.Minute)},
		Clock: a.clock, Logger: a.log,
	})
	a.inFlight = clients.NewInFlight(api.DefaultMaxRequestsPerClient)
	a.e2b = e2b.NewHandler(svc, e2b.HandlerOptions{
		InFlight: a.inFlight,
		Tokens:   auth.NewTokens(a.clients), Interpreter: interp.New(a.runs, svc, a.log),
		Audit: a.recorder, Refusals: a.strangers, Source: api.SourceAddr(cfg.TrustedProxies),
		Resources: e2b.Resources{CPUs: max(1, int((cfg.NanoCPUs+999_999_999)/1_000_000_000)),
			MemoryMB: cfg.MemoryLimit >> 20, DiskSizeMB: cfg.QuotaBytes >> 20},
	})
	return a.start(context.WithoutCancel(ctx), e2b.NewSweeper(svc))
}
