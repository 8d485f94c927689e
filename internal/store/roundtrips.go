package store

import (
	"context"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
)

// RoundTrips counts the process's round trips to Redis — a command, or a
// pipeline or transaction sent at once — as the metric
// runbox_redis_round_trips_total: what a run's path costs in waits on
// Redis (make bench sets it beside the runs). Conn.CountRoundTrips adds
// it to the process's client.
type RoundTrips struct {
	count prometheus.Counter
}

// newRoundTrips returns a RoundTrips whose metric goes to reg.
func newRoundTrips(reg prometheus.Registerer) *RoundTrips {
	r := &RoundTrips{count: prometheus.NewCounter(prometheus.CounterOpts{
		Name: "runbox_redis_round_trips_total",
		Help: "Round trips to Redis: each command, pipeline or transaction this process sent.",
	})}
	reg.MustRegister(r.count)
	return r
}

func (r *RoundTrips) DialHook(next redis.DialHook) redis.DialHook { return next }

func (r *RoundTrips) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		r.count.Inc()
		return next(ctx, cmd)
	}
}

func (r *RoundTrips) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		r.count.Inc()
		return next(ctx, cmds)
	}
}
