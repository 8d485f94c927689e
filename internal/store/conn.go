package store

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
)

// Conn is the process's one pool of connections to Redis. The store's
// types and packages send their commands through it, and asynq's parts
// ride on it too (see Redis): one pool per process.
type Conn struct {
	rdb redis.UniversalClient
}

// NewConn returns a Conn on rdb. Closing the Conn closes rdb.
func NewConn(rdb redis.UniversalClient) *Conn { return &Conn{rdb: rdb} }

// ClientOptions makes a Redis client. asynq.RedisConnOpt, which
// asynq.ParseRedisURI returns for REDIS_URL, has this shape: the caller
// parses the URL with asynq's parser, so that runbox and asynq read it
// alike (redis://, rediss://, redis-sentinel://), and the store need not
// depend on asynq to take the result.
type ClientOptions interface {
	MakeRedisClient() any
}

// Connect returns a Conn on the client opt makes. It does not wait for
// Redis: Ping does.
func Connect(opt ClientOptions) (*Conn, error) {
	rdb, ok := opt.MakeRedisClient().(redis.UniversalClient)
	if !ok {
		return nil, errors.New("not a Redis client this service can use")
	}
	return NewConn(rdb), nil
}

// Ping checks that Redis answers.
func (c *Conn) Ping(ctx context.Context) error { return c.rdb.Ping(ctx).Err() }

// Close closes the connections.
func (c *Conn) Close() error { return c.rdb.Close() }

// Redis returns the client itself, for the store's packages, which speak
// Redis.
func (c *Conn) Redis() redis.UniversalClient { return c.rdb }

// MakeRedisClient returns the process's client wrapped so that closing it
// does nothing. It implements asynq.RedisConnOpt (queue.Conn): asynq's
// parts made from the Conn share its pool instead of opening their own,
// and close the wrapper, not the pool, when they are closed or shut down.
// The Conn's Close closes the pool.
func (c *Conn) MakeRedisClient() any { return sharedClient{c.rdb} }

// sharedClient is the process's client, whose Close is its Conn's.
type sharedClient struct{ redis.UniversalClient }

func (sharedClient) Close() error { return nil }

// WatchWrites has every command's reply watched for Redis refusing
// writes, and returns the watch, whose metrics go to reg.
func (c *Conn) WatchWrites(reg prometheus.Registerer, log *slog.Logger) *WriteWatch {
	w := newWriteWatch(reg, log)
	w.rdb = c.rdb
	c.rdb.AddHook(w)
	return w
}

// CountRoundTrips counts the process's round trips to Redis in reg
// (RoundTrips).
func (c *Conn) CountRoundTrips(reg prometheus.Registerer) {
	c.rdb.AddHook(newRoundTrips(reg))
}

// RouteLogs sends go-redis's own messages (reconnects, dial failures),
// which it writes to stderr by default, to log at debug level. go-redis
// keeps its logger in a package variable: call this once, from main.
func RouteLogs(log *slog.Logger) { redis.SetLogger(redisLogger{log}) }

type redisLogger struct{ log *slog.Logger }

func (l redisLogger) Printf(ctx context.Context, format string, v ...any) {
	l.log.DebugContext(ctx, "redis: "+fmt.Sprintf(format, v...))
}

// Subscription delivers the messages published on a channel.
type Subscription struct {
	ps *redis.PubSub
	ch <-chan *redis.Message
}

// ErrSubscriptionEnded reports a subscription whose connection was closed.
var ErrSubscriptionEnded = errors.New("subscription ended")

// subscribe subscribes to channel and waits until Redis confirms it, so
// that no message published after it returns is missed.
func (c *Conn) subscribe(ctx context.Context, channel string) (*Subscription, error) {
	ps := c.rdb.Subscribe(ctx, channel)
	if _, err := ps.Receive(ctx); err != nil {
		_ = ps.Close()
		return nil, fmt.Errorf("subscribe to %s: %w", channel, err)
	}
	return &Subscription{ps: ps, ch: ps.Channel()}, nil
}

// Next waits for the next message and returns its payload.
func (s *Subscription) Next(ctx context.Context) (string, error) {
	select {
	case <-ctx.Done():
		return "", ctx.Err()
	case msg, ok := <-s.ch:
		if !ok {
			return "", ErrSubscriptionEnded
		}
		return msg.Payload, nil
	}
}

// Close ends the subscription.
func (s *Subscription) Close() error { return s.ps.Close() }
