package store

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
)

// WriteWatch notices Redis refusing writes — out of memory under
// maxmemory with noeviction (the policy docker-compose.yml sets: runbox's
// state must not be evicted), a failed save with stop-writes-on-bgsave-
// error, a read-only replica — in the replies to every command of the
// process, and says so: a log line when it starts and when it ends, the
// metrics runbox_redis_refusing_writes and
// runbox_redis_write_refusals_total, and Check for health endpoints. Add
// Conn.WatchWrites makes one.
type WriteWatch struct {
	rdb      redis.UniversalClient
	log      *slog.Logger
	refusals prometheus.Counter
	gauge    prometheus.Gauge
	probeKey string

	mu       sync.Mutex
	refusing bool
	since    time.Time
}

// newWriteWatch returns a WriteWatch whose metrics go to reg.
func newWriteWatch(reg prometheus.Registerer, log *slog.Logger) *WriteWatch {
	w := &WriteWatch{log: log.With("component", "redis"), probeKey: prefix + "health:" + rand.Text()[:12],
		refusals: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "runbox_redis_write_refusals_total",
			Help: "Commands Redis refused because it refuses writes (out of memory under noeviction, a failed save, a read-only replica).",
		}),
		gauge: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "runbox_redis_refusing_writes",
			Help: "1 while Redis refuses this process's writes, else 0.",
		}),
	}
	reg.MustRegister(w.refusals, w.gauge)
	return w
}

// refusesWrites reports whether err is Redis refusing a write; a script's
// error carries the refusal of the command that failed in it.
func refusesWrites(err error) bool {
	var re redis.Error
	if err == nil || !errors.As(err, &re) {
		return false
	}
	msg := re.Error()
	return strings.Contains(msg, "OOM command not allowed") || strings.HasPrefix(msg, "MISCONF ") ||
		strings.HasPrefix(msg, "READONLY ") || strings.Contains(msg, "-MISCONF ") || strings.Contains(msg, "-READONLY ")
}

// writes are plain write commands: one that succeeds shows that Redis
// takes writes again.
var writes = map[string]bool{"set": true, "xadd": true, "rpush": true, "lpush": true, "hset": true, "zadd": true,
	"sadd": true, "incr": true, "incrby": true, "hincrby": true, "expire": true, "pexpire": true}

// observe looks at a command's reply: err, the hook's own (go-redis
// sets the command's error only after its hooks return).
func (w *WriteWatch) observe(cmd redis.Cmder, err error) {
	switch {
	case refusesWrites(err):
		w.refusals.Inc()
		w.mu.Lock()
		started := !w.refusing
		if started {
			w.refusing, w.since = true, time.Now()
		}
		w.mu.Unlock()
		if started {
			w.gauge.Set(1)
			w.log.Error("Redis refuses writes: calls that must be recorded are refused, and runs cannot be queued, "+
				"until it has room again (see maxmemory in docs/scaling.md)", "command", cmd.Name(), "err", err)
		}
	case err == nil && writes[cmd.Name()]:
		w.mu.Lock()
		ended := w.refusing
		since := w.since
		w.refusing = false
		w.mu.Unlock()
		if ended {
			w.gauge.Set(0)
			w.log.Warn("Redis accepts writes again", "refused_for", time.Since(since).Round(time.Second))
		}
	}
}

// DialHook is go-redis's.
func (w *WriteWatch) DialHook(next redis.DialHook) redis.DialHook { return next }

// ProcessHook observes a command's reply.
func (w *WriteWatch) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		w.observe(cmd, err)
		return err
	}
}

// ProcessPipelineHook observes the reply of each command of a pipeline.
func (w *WriteWatch) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		for _, c := range cmds {
			w.observe(c, c.Err())
		}
		return err
	}
}

// Check writes a small key, for readiness: it fails, saying why, while
// Redis refuses writes, and its success ends a refusal noticed before.
func (w *WriteWatch) Check(ctx context.Context) error {
	err := w.rdb.Set(ctx, w.probeKey, time.Now().Unix(), time.Minute).Err()
	if refusesWrites(err) {
		return fmt.Errorf("redis refuses writes (out of memory under maxmemory, or read-only): %w", err)
	}
	return err
}
