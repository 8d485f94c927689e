package queue

import (
	"context"
	"net/http"
	"strings"
	"time"

	"github.com/hibiken/asynq"
	"github.com/hibiken/asynqmon"
	"github.com/prometheus/client_golang/prometheus"
)

// Dashboard returns asynqmon's read-only dashboard of every queue, served
// under root, on conn, the process's connection: it holds none of its own.
func Dashboard(conn Conn, root string) http.Handler {
	return asynqmon.New(asynqmon.Options{RootPath: root, RedisConnOpt: conn, ReadOnly: true})
}

// collector reports the run queue's depth, read from Redis at each
// scrape.
type collector struct {
	inspector *asynq.Inspector
	pending   *prometheus.Desc
	active    *prometheus.Desc
}

// NewCollector returns the metrics of the run queue's depth on conn, the
// process's connection: it holds none of its own.
func NewCollector(conn Conn) prometheus.Collector {
	return &collector{
		inspector: asynq.NewInspector(conn),
		pending:   prometheus.NewDesc("runbox_queue_pending", "Runs waiting in the queue for an executor.", nil, nil),
		active:    prometheus.NewDesc("runbox_queue_active", "Runs an executor is working on.", nil, nil),
	}
}

func (q *collector) Describe(ch chan<- *prometheus.Desc) {
	ch <- q.pending
	ch <- q.active
}

func (q *collector) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	type counts struct{ pending, active int }
	done := make(chan *counts, 1)
	go func() {
		// The shared queue and every executor's own (ExecutorQueue).
		names, err := q.inspector.Queues()
		if err != nil {
			done <- nil
			return
		}
		var c counts
		for _, name := range names {
			if name != Name && !strings.HasPrefix(name, ExecutorQueue("")) {
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
