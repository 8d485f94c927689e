// Package webhooks tells clients' receivers that their runs ended (and,
// if they asked, started) and that their batches ended: each webhook a
// POST of the record as JSON, signed per Standard Webhooks (signature),
// delivered at least once through the queue's "webhooks" with the same
// webhook-id on every attempt, retried with exponential back-off and
// jitter for WEBHOOK_RETRY_FOR, never to a place the policy refuses
// (target.go).
//
// A webhook is written to an outbox by the script that records what it
// tells of (internal/store); the Relay moves the outbox into the queue
// (the task's id is the webhook's, so moving one twice makes one task);
// the queue's worker (queue.WebhookWorker) hands them to the Service,
// which delivers — each api's workers shared between clients, and a
// failing receiver's host left to cool down (fair.go). The Service also
// checks callbacks when runs are submitted (a request's together, within
// one bound of time), and answers for deliveries.
package webhooks

import (
	"context"
	"crypto/x509"
	"errors"
	"log/slog"
	"net/http"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/runbox-dev/runbox"
	"github.com/runbox-dev/runbox/internal/egress"
	"github.com/runbox-dev/runbox/internal/webhooks/signature"
)

// Defaults of WEBHOOK_BACKOFF and WEBHOOK_RETRY_FOR.
const (
	DefaultBackoff  = 5 * time.Second
	DefaultRetryFor = 24 * time.Hour
)

// MaxPending bounds the webhooks of one client not yet done with
// (delivered, given up, or gone): past it, runs and batches asking for
// callbacks are refused until receivers catch up. It bounds what a
// client whose receiver is down can make Redis hold.
const MaxPending = 10000

// keep is how long a webhook, its attempts and the record it tells of are
// kept beyond its retries.
const keep = 24 * time.Hour

// Client is a client's webhook settings.
type Client struct {
	// Secrets sign its webhooks; none: it may not ask for any.
	Secrets signature.Secrets
	// URL is its default callback (webhook_url): runs submitted one by
	// one and batches that name none are told of there.
	URL string
	// Domains are the hosts its callbacks may go to besides
	// WEBHOOK_ALLOW (webhook_domains).
	Domains egress.Patterns
	// Started: its runs' starts are told of too (webhook_events
	// run.started).
	Started bool
}

// Events are the webhook_events a client may name; a run's end and a
// batch's are always told of.
var Events = []string{runbox.WebhookRunStarted, runbox.WebhookRunCompleted, runbox.WebhookBatchCompleted}

// Store is what webhooks need of internal/store.
type Store interface {
	Webhook(ctx context.Context, id string) (runbox.Webhook, error)
	Outbox(ctx context.Context, n int) ([]string, error)
	Relayed(ctx context.Context, id string, ttl time.Duration) error
	BeginAttempt(ctx context.Context, id string) (int, error)
	RecordAttempt(ctx context.Context, d runbox.Delivery, ttl time.Duration) error
	EndWebhook(ctx context.Context, w runbox.Webhook, state string) error
	Redeliver(ctx context.Context, w runbox.Webhook, ttl time.Duration) error
	PendingWebhooks(ctx context.Context, client string, horizon time.Duration) (int, error)
	Deliveries(ctx context.Context, ids ...string) ([]runbox.Delivery, error)
	Run(ctx context.Context, id string) (runbox.Run, error)
	Batch(ctx context.Context, id string) (runbox.BatchRecord, error)
}

// Tasks are the webhooks' tasks in the queue (*queue.Webhooks), each
// task's id the webhook's.
type Tasks interface {
	// Enqueue makes webhook id's task unless it has one; it reports
	// whether it made one.
	Enqueue(ctx context.Context, id string) (bool, error)
	// Requeue makes webhook id's task pending now, made anew if the queue
	// is done with it.
	Requeue(ctx context.Context, id string) error
}

// Options configure a Service.
type Options struct {
	Policy *Policy
	// Clients are the clients' settings, by name.
	Clients map[string]Client
	// Backoff is the first retry's delay, doubling with jitter
	// (WEBHOOK_BACKOFF); RetryFor how long a webhook is retried
	// (WEBHOOK_RETRY_FOR).
	Backoff, RetryFor time.Duration
	// AttemptTimeout bounds each attempt (default AttemptTimeout).
	AttemptTimeout time.Duration
	// PerClient bounds the attempts of one client's webhooks under way
	// at once in this api (WEBHOOK_CONCURRENCY_PER_CLIENT; default
	// DefaultPerClient): fair.go.
	PerClient int
	// RootCAs, when set, are the roots receivers' certificates are
	// checked against instead of the system's (tests).
	RootCAs  *x509.CertPool
	Clock    clockwork.Clock
	Registry prometheus.Registerer
	Logger   *slog.Logger
}

// Service checks callbacks and delivers webhooks.
type Service struct {
	o       Options
	store   Store
	http    *http.Client
	fair    *fairness
	tasks   Tasks
	log     *slog.Logger
	metrics metrics
}

// New returns a Service that queues its webhooks' deliveries in tasks.
func New(tasks Tasks, st Store, o Options) *Service {
	if o.Backoff <= 0 {
		o.Backoff = DefaultBackoff
	}
	if o.RetryFor <= 0 {
		o.RetryFor = DefaultRetryFor
	}
	if o.AttemptTimeout <= 0 {
		o.AttemptTimeout = AttemptTimeout
	}
	if o.PerClient <= 0 {
		o.PerClient = DefaultPerClient
	}
	if o.Clock == nil {
		o.Clock = clockwork.NewRealClock()
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.Policy == nil {
		o.Policy = &Policy{}
	}
	return &Service{o: o, store: st, http: newHTTPClient(o.Policy, o.RootCAs, o.AttemptTimeout), fair: newFairness(o), tasks: tasks,
		log: o.Logger.With("component", "webhooks"), metrics: newMetrics(o.Registry)}
}

// ttl is how long a webhook and what it tells of are kept once relayed.
func (s *Service) ttl() time.Duration { return s.o.RetryFor + keep }

// Callback checks where a run of client is told of: url, or when it is
// empty and fallback is set, the client's default (webhook_url). No URL
// at all is no callback. A URL the policy refuses is an invalid_argument
// naming why, at once: never a webhook silently dropped later.
func (s *Service) Callback(ctx context.Context, client, url string, fallback bool) (runbox.Callback, error) {
	if url == "" {
		if c := s.o.Clients[client]; fallback && c.URL != "" {
			url = c.URL
		} else {
			return runbox.Callback{}, nil
		}
	}
	cbs, errs := s.Callbacks(ctx, client, []string{url})
	return cbs[0], errs[0]
}

// MaxCallbackHosts bounds the distinct hosts the callbacks of one request
// (a batch's runs) may name: each is resolved while the request waits.
const MaxCallbackHosts = 32

// resolveAtOnce bounds the hosts of one request resolved at once.
const resolveAtOnce = 8

// Callbacks checks urls as callbacks of client, each as Callback checks
// one (no fallback), but together and within one bound of time: each
// distinct host is resolved once, resolveAtOnce at a time, all within
// resolveTimeout (and ctx) — a batch whose thousand runs name hosts whose
// DNS never answers waits 5 s, not 5 s a host — and a host past the first
// MaxCallbackHosts is refused unresolved. It returns each url's callback,
// or why it was refused, in urls' order.
func (s *Service) Callbacks(ctx context.Context, client string, urls []string) ([]runbox.Callback, []error) {
	cbs, errs := make([]runbox.Callback, len(urls)), make([]error, len(urls))
	c := s.o.Clients[client]
	targets := make([]Target, len(urls))
	first := map[string]int{} // a host's index in hosts
	var hosts []Target
	for i, url := range urls {
		if c.Secrets.Len() == 0 {
			errs[i] = runbox.Errorf(runbox.EInvalid,
				"callback_url: this client has no webhook signing secret (webhook_secret in CLIENTS_FILE, or WEBHOOK_SECRET for the token MCP_API_TOKEN)")
			continue
		}
		t, err := s.o.Policy.Parse(url, c.Domains)
		if err != nil {
			errs[i] = err
			continue
		}
		if _, seen := first[t.Host]; !seen {
			if len(hosts) == MaxCallbackHosts {
				errs[i] = refused("%s: the request's callbacks name more than %d hosts", t.Host, MaxCallbackHosts)
				continue
			}
			first[t.Host] = len(hosts)
			hosts = append(hosts, t)
		}
		targets[i] = t
	}
	resolved := s.o.Policy.resolveAll(ctx, hosts)
	for i := range urls {
		if errs[i] != nil {
			continue
		}
		if err := resolved[first[targets[i].Host]]; err != nil {
			errs[i] = err
			continue
		}
		cbs[i] = runbox.Callback{URL: targets[i].URL, Started: c.Started}
	}
	return cbs, errs
}

// Admit refuses n more webhooks of client while it has MaxPending not
// yet done with.
func (s *Service) Admit(ctx context.Context, client string, n int) error {
	if n == 0 {
		return nil
	}
	pending, err := s.store.PendingWebhooks(ctx, client, s.ttl())
	if err != nil {
		return err
	}
	if pending+n > MaxPending {
		return runbox.Limited(runbox.EBusy, time.Minute,
			"this client has %d webhooks not yet delivered, and may have %d; retry when its receiver has caught up", pending, MaxPending)
	}
	return nil
}

// ids are the webhooks that may tell of a run, or of a batch.
func ids(subject string, batch bool) []string {
	if batch {
		return []string{runbox.WebhookID(subject, runbox.WebhookBatchCompleted)}
	}
	return []string{runbox.WebhookID(subject, runbox.WebhookRunStarted), runbox.WebhookID(subject, runbox.WebhookRunCompleted)}
}

// Deliveries returns the attempts to deliver the webhooks of a run (or of
// a batch), oldest first. The caller has checked that the subject is the
// client's.
func (s *Service) Deliveries(ctx context.Context, subject string, batch bool) ([]runbox.Delivery, error) {
	return s.store.Deliveries(ctx, ids(subject, batch)...)
}

// ErrNoWebhook reports a run or batch that has no webhook (yet).
var ErrNoWebhook = runbox.Errorf(runbox.ENotFound, "no webhook was written for this: it asked for no callback, or has not ended")

// Redeliver delivers the webhook of a run's end (or a batch's) again,
// with its id, its retries' clock started anew. It returns the webhook.
func (s *Service) Redeliver(ctx context.Context, subject string, batch bool) (runbox.Webhook, error) {
	all := ids(subject, batch)
	w, err := s.store.Webhook(ctx, all[len(all)-1])
	if errors.Is(err, runbox.ErrWebhookNotFound) {
		return runbox.Webhook{}, ErrNoWebhook
	}
	if err != nil {
		return runbox.Webhook{}, err
	}
	if err := s.store.Redeliver(ctx, w, s.ttl()); err != nil {
		return runbox.Webhook{}, err
	}
	if err := s.tasks.Requeue(ctx, w.ID); err != nil {
		return runbox.Webhook{}, err
	}
	w.State = runbox.WebhookPending
	return w, nil
}
