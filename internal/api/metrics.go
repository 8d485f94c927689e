package api

import (
	"context"
	"strconv"
	"strings"
	"time"

	"github.com/hibiken/asynq"
	"github.com/labstack/echo/v4"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/runbox-dev/runbox/internal/queue"
	"github.com/runbox-dev/runbox/internal/store"
)

// requestCounter counts requests by route and status.
func requestCounter(reg prometheus.Registerer) echo.MiddlewareFunc {
	requests := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "runbox_http_requests_total", Help: "HTTP requests, by route and status.",
	}, []string{"route", "code"})
	reg.MustRegister(requests)
	return func(next echo.HandlerFunc) echo.HandlerFunc {
		return func(c echo.Context) error {
			err := next(c)
			if err != nil {
				c.Error(err)
			}
			requests.WithLabelValues(c.Path(), strconv.Itoa(c.Response().Status)).Inc()
			return nil
		}
	}
}

// queueCollector reports the run queue's depth, read from Redis at each
// scrape.
type queueCollector struct {
	inspector *asynq.Inspector
	pending   *prometheus.Desc
	active    *prometheus.Desc
}

func newQueueCollector(conn *store.Conn) *queueCollector {
	return &queueCollector{
		inspector: asynq.NewInspectorFromRedisClient(conn.Redis()),
		pending:   prometheus.NewDesc("runbox_queue_pending", "Runs waiting in the queue for an executor.", nil, nil),
		active:    prometheus.NewDesc("runbox_queue_active", "Runs an executor is working on.", nil, nil),
	}
}

func (q *queueCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- q.pending
	ch <- q.active
}

func (q *queueCollector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	type counts struct{ pending, active int }
	done := make(chan *counts, 1)
	go func() {
		// The shared queue and every executor's own (queue.ExecutorQueue).
		names, err := q.inspector.Queues()
		if err != nil {
			done <- nil
			return
		}
		var c counts
		for _, name := range names {
			if name != queue.Name && !strings.HasPrefix(name, queue.ExecutorQueue("")) {
				continue
			}
			info, err := q.inspector.GetQueueInfo(name)
			if err != nil {
				continue // removed since
			}
			c.pending += info.Pending
			c.active += info.Active
		}
		done <- &c
	}()
	select {
	case c := <-done:
		if c != nil {
			ch <- prometheus.MustNewConstMetric(q.pending, prometheus.GaugeValue, float64(c.pending))
			ch <- prometheus.MustNewConstMetric(q.active, prometheus.GaugeValue, float64(c.active))
		}
	case <-ctx.Done():
	}
}
