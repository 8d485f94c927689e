package app

import (
	"context"
	"fmt"
	"log/slog"
	"slices"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/runbox-dev/runbox"
	"github.com/runbox-dev/runbox/internal/clients"
	"github.com/runbox-dev/runbox/internal/lifecycle"
	"github.com/runbox-dev/runbox/internal/queue"
	"github.com/runbox-dev/runbox/internal/store"
	"github.com/runbox-dev/runbox/internal/webhooks"
	"github.com/runbox-dev/runbox/internal/webhooks/signature"
)

// startWebhooks builds the webhooks' service from the configuration —
// every client's settings, its default callback checked against the
// policy — and starts what delivers them: the relay from the outbox and
// the worker. Stop the group they return when the api stops.
func startWebhooks(ctx context.Context, cfg *Config, cs clients.Clients, conn *store.Conn, st *store.Store,
	reg prometheus.Registerer, log *slog.Logger) (*webhooks.Service, lifecycle.Group, error) {
	policy := cfg.WebhookPolicy
	settings := map[string]webhooks.Client{}
	if len(cfg.Webhooks.Secret) > 0 {
		settings[runbox.DefaultClient] = webhooks.Client{Secrets: cfg.WebhookSecrets}
	}
	for name, w := range cs.Webhooks() {
		secrets, err := signature.Parse(w.Secrets)
		if err != nil {
			return nil, nil, fmt.Errorf("config: CLIENTS_FILE: client %q: webhook_secret: %w", name, err)
		}
		c := webhooks.Client{Secrets: secrets, Domains: w.Domains, Started: slices.Contains(w.Events, runbox.WebhookRunStarted)}
		if w.URL != "" {
			t, err := policy.Parse(w.URL, w.Domains)
			if err != nil {
				return nil, nil, fmt.Errorf("config: CLIENTS_FILE: client %q: webhook_url: %s", name, runbox.ErrorMessage(err))
			}
			c.URL = t.URL
		}
		settings[name] = c
	}
	svc := webhooks.New(queue.NewWebhooks(conn), st, webhooks.Options{Policy: &policy, Clients: settings,
		Backoff: cfg.Webhooks.Backoff, RetryFor: cfg.Webhooks.RetryFor, PerClient: cfg.Webhooks.PerClient, Registry: reg, Logger: log})
	group := lifecycle.Group{queue.NewWebhookWorker(conn, svc, log.With("component", "webhooks")), webhooks.NewRelay(svc)}
	if err := group.Start(context.WithoutCancel(ctx)); err != nil {
		return nil, nil, err
	}
	return svc, group, nil
}
