package clients

import "github.com/prometheus/client_golang/prometheus"

// Metrics counts what each client does, for operators: calls, runs, and
// refusals by a limit of its tier. A nil *Metrics counts nothing.
type Metrics struct {
	calls   *prometheus.CounterVec
	runs    *prometheus.CounterVec
	limited *prometheus.CounterVec
}

// NewMetrics registers the counters with reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	m := &Metrics{
		calls: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "runbox_client_calls_total", Help: "Tool calls and REST requests, by client.",
		}, []string{"client"}),
		runs: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "runbox_client_runs_total", Help: "Runs submitted, by client.",
		}, []string{"client"}),
		limited: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "runbox_client_limited_total", Help: "Calls refused by a limit of the client's tier, by client and error.",
		}, []string{"client", "error"}),
	}
	reg.MustRegister(m.calls, m.runs, m.limited)
	return m
}

// Call counts a call of client.
func (m *Metrics) Call(client string) {
	if m != nil {
		m.calls.WithLabelValues(client).Inc()
	}
}

// Run counts a run of client.
func (m *Metrics) Run(client string) {
	if m != nil {
		m.runs.WithLabelValues(client).Inc()
	}
}

// Limited counts a refusal of client with code (rate_limited,
// quota_exceeded).
func (m *Metrics) Limited(client, code string) {
	if m != nil {
		m.limited.WithLabelValues(client, code).Inc()
	}
}
