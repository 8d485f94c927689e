package webhooks

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics count the attempts to deliver webhooks, by client and outcome
// (delivered, retry, failed, gone), and time them; and count the webhooks
// deferred without an attempt, by client and reason (fair.go).
type metrics struct {
	attempts *prometheus.CounterVec
	seconds  prometheus.Histogram
	deferred *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) metrics {
	m := metrics{
		attempts: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "runbox_webhook_attempts_total",
			Help: "Attempts to deliver a webhook, by client and outcome: delivered, retry (to be tried again), failed (given up), gone (410).",
		}, []string{"client", "outcome"}),
		seconds: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "runbox_webhook_attempt_seconds",
			Help:    "How long an attempt to deliver a webhook took.",
			Buckets: prometheus.ExponentialBuckets(0.005, 4, 8),
		}),
		deferred: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "runbox_webhook_deferred_total",
			Help: "Webhooks handed back to the queue without an attempt, by client and reason: client_busy (its share of the workers in use), circuit_open (its receiver's host failing).",
		}, []string{"client", "reason"}),
	}
	if reg != nil {
		reg.MustRegister(m.attempts, m.seconds, m.deferred)
	}
	return m
}

func (m metrics) attempt(client, outcome string, took time.Duration) {
	m.attempts.WithLabelValues(client, outcome).Inc()
	m.seconds.Observe(took.Seconds())
}
