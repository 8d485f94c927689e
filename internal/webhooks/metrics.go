package webhooks

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// metrics count the attempts to deliver webhooks, by client and outcome
// (delivered, retry, failed, gone), and time them.
type metrics struct {
	attempts *prometheus.CounterVec
	seconds  prometheus.Histogram
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
	}
	if reg != nil {
		reg.MustRegister(m.attempts, m.seconds)
	}
	return m
}

func (m metrics) attempt(client, outcome string, took time.Duration) {
	m.attempts.WithLabelValues(client, outcome).Inc()
	m.seconds.Observe(took.Seconds())
}
