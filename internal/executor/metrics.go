package executor

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/runbox-dev/runbox"
)

// metrics are what an executor tells Prometheus.
type metrics struct {
	finished  *prometheus.CounterVec
	duration  *prometheus.HistogramVec
	announced prometheus.Counter
}

// newMetrics registers an executor's metrics on reg (nil: none kept).
// warm and live report the sandboxes waiting and existing.
func newMetrics(reg prometheus.Registerer, warm, live func() int) *metrics {
	m := &metrics{
		finished: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "runbox_runs_finished_total", Help: "Runs this executor ended, by language and status.",
		}, []string{"language", "status"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name: "runbox_run_duration_seconds", Help: "How long programs ran, by language.",
			Buckets: []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60},
		}, []string{"language"}),
		announced: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "runbox_runs_announced_total", Help: "Announced runs this executor took at once, rather than at asynq's next poll.",
		}),
	}
	if reg != nil {
		reg.MustRegister(m.finished, m.duration, m.announced,
			prometheus.NewGaugeFunc(prometheus.GaugeOpts{
				Name: "runbox_sandboxes_warm", Help: "Idle sandboxes kept for their conversations.",
			}, func() float64 { return float64(warm()) }),
			prometheus.NewGaugeFunc(prometheus.GaugeOpts{
				Name: "runbox_sandboxes", Help: "Sandbox containers this executor has, running or warm.",
			}, func() float64 { return float64(live()) }),
		)
	}
	return m
}

func (m *metrics) observe(language string, status runbox.Status, d time.Duration) {
	m.finished.WithLabelValues(language, string(status)).Inc()
	m.duration.WithLabelValues(language).Observe(d.Seconds())
}
