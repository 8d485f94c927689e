package store

import (
	"context"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/redis/go-redis/v9"

	"github.com/runbox-dev/runbox/internal/testenv"
)

// TestRoundTrips: a command is one round trip, and so is a pipeline or a
// transaction of several, once their connection is made.
func TestRoundTrips(t *testing.T) {
	ctx := context.Background()
	_, url := testenv.Miniredis(t)
	opt, err := redis.ParseURL(url)
	if err != nil {
		t.Fatal(err)
	}
	rdb := redis.NewClient(opt)
	t.Cleanup(func() { rdb.Close() })
	r := newRoundTrips(prometheus.NewRegistry())
	rdb.AddHook(r)
	for _, tt := range []struct {
		name string
		do   func() error
		want float64
	}{
		{"a command", func() error { return rdb.Set(ctx, "a", "1", 0).Err() }, 1},
		{"a pipeline", func() error {
			_, err := rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
				p.Set(ctx, "b", "1", 0)
				p.Incr(ctx, "b")
				p.Get(ctx, "b")
				return nil
			})
			return err
		}, 1},
		{"a transaction", func() error {
			_, err := rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
				p.Incr(ctx, "c")
				p.Incr(ctx, "c")
				return nil
			})
			return err
		}, 1},
	} {
		t.Run(tt.name, func(t *testing.T) {
			// Once before counting: making a connection costs round trips
			// of its own (the handshake), counted too.
			if err := tt.do(); err != nil {
				t.Fatal(err)
			}
			before := testutil.ToFloat64(r.count)
			if err := tt.do(); err != nil {
				t.Fatal(err)
			}
			if got := testutil.ToFloat64(r.count) - before; got != tt.want {
				t.Errorf("%v round trips, want %v", got, tt.want)
			}
		})
	}
}
