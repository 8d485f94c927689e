package app

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"

	"github.com/jonboulle/clockwork"

	"github.com/runbox-dev/runbox/internal/api"
	"github.com/runbox-dev/runbox/internal/config"
	"github.com/runbox-dev/runbox/internal/conversations"
	"github.com/runbox-dev/runbox/internal/leader"
	"github.com/runbox-dev/runbox/internal/lifecycle"
	"github.com/runbox-dev/runbox/internal/link"
	"github.com/runbox-dev/runbox/internal/mcp"
	"github.com/runbox-dev/runbox/internal/preview"
	"github.com/runbox-dev/runbox/internal/projects"
	"github.com/runbox-dev/runbox/internal/runs"
	"github.com/runbox-dev/runbox/internal/store"
)

// previews are the api's parts that reach into sandboxes: preview URLs
// (issued by get_preview_url and REST, served on preview hosts) and the
// security gateway's projects.
type previews struct {
	service *preview.Service
	router  *preview.Router
	// link reaches the executors' sandboxes (E2B's sandboxes too).
	link link.Link
	// background are the router and the projects' janitor.
	background lifecycle.Group
}

// previewDeps are what the previews are built on.
type previewDeps struct {
	store    *store.Store
	secret   []byte
	executor *Executor // embedded, or nil: the executors are reached through the link
	mcp      *mcp.Server
	runs     *runs.Service
	convs    *conversations.Service
	ready    map[string]api.Check
	elector  *leader.Elector
	clock    clockwork.Clock
	// secrets are those the projects' output never shows besides
	// config.Secrets: the shared secret, a generated token.
	secrets []string
	// unserved: no process serves preview hosts (stdio, embedded Redis).
	unserved bool
	log      *slog.Logger
}

// startPreviews builds the previews, registers their tools, and starts
// their background parts.
func startPreviews(ctx context.Context, cfg *config.Config, d previewDeps) (*previews, error) {
	domain, err := preview.ParseDomain(cfg.PreviewDomain, cfg.PreviewScheme)
	if err != nil {
		return nil, fmt.Errorf("config: PREVIEW_BASE_DOMAIN %w", err)
	}
	if pub, err := url.Parse(cfg.PublicBaseURL); err == nil && domain.Under(pub.Host) {
		return nil, errors.New("config: PUBLIC_BASE_URL names a host under PREVIEW_BASE_DOMAIN, where only previews are served")
	}
	var lk link.Link
	if d.executor != nil {
		lk = link.Local{ID: cfg.ExecutorID, Backend: d.executor.Executor}
	} else {
		lk = link.NewRemote(d.store.Executors, link.Key(d.secret))
	}
	p := &previews{link: lk}
	p.service = preview.NewService(preview.Options{Key: preview.Key(d.secret), Domain: domain, TTL: cfg.PreviewURLTTL,
		Store: d.store, Link: lk, Logger: d.log, Unserved: d.unserved})
	p.router = preview.NewRouter(p.service, lk, preview.Limits{MaxRequest: cfg.PreviewMaxRequest,
		MaxResponse: cfg.PreviewMaxResponse, Rate: cfg.PreviewRate, WriteStall: api.WriteStall, StreamIdle: cfg.PreviewStreamIdle,
		MaxStreams: cfg.PreviewMaxStreams, MaxStreamsPerConversation: cfg.PreviewMaxStreamsPerConversation}, d.clock, d.log)
	preview.Register(d.mcp, p.service)

	proj := projects.New(projects.Options{Runs: d.runs, Store: d.store, Link: lk, Previews: p.service,
		Redactor: projects.NewRedactor(append(cfg.Secrets, d.secrets...)...), TTL: cfg.ProjectTTL, Logger: d.log})
	checks := make(map[string]func(context.Context) error, len(d.ready))
	for name, c := range d.ready {
		checks[name] = c
	}
	projects.Register(d.mcp, proj, checks)

	p.background = lifecycle.Group{p.router, projects.NewJanitor(d.store.Projects, d.convs, d.elector.Every, d.clock, d.log)}
	if err := p.background.Start(context.WithoutCancel(ctx)); err != nil {
		return nil, err
	}
	return p, nil
}
