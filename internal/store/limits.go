package store

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/go-redis/redis_rate/v10"
	"github.com/redis/go-redis/v9"
)

// Limits counts what clients may do: calls a minute and new conversations
// an hour (redis_rate), runs queued or running at once, and run seconds a
// day. Runs are counted as they are recorded and end, by the run scripts
// (admission.go).
type Limits struct {
	*base
	rate *redis_rate.Limiter
}

// The tiers' limits are counted in Redis, so that every api replica
// shares them: calls and new conversations with GCRA (redis_rate), the
// runs a client has queued or running in a sorted set, run seconds in a
// counter per day.

func callsKey(client string) string      { return "calls:" + client } // redis_rate adds its prefix
func newConvsKey(client string) string   { return "convs:" + client }
func activeRunsKey(client string) string { return prefix + "client:" + client + ":active" }
func runSecondsKey(client string, day time.Time) string {
	return prefix + "client:" + client + ":runsec:" + dayKey(day)
}
func knownConvKey(key string) string { return prefix + "conv:" + key + ":known" }

// activeRunHorizon is how long a run counts as active at most, should its
// end never be recorded (its record expired with a crash).
const activeRunHorizon = 24 * time.Hour

// AllowCall counts a call of client against perMinute; when it is over,
// it returns how long to wait.
func (s *Limits) AllowCall(ctx context.Context, client string, perMinute int) (time.Duration, error) {
	res, err := s.rate.Allow(ctx, callsKey(client), redis_rate.PerMinute(perMinute))
	if err != nil {
		return 0, fmt.Errorf("count call: %w", err)
	}
	if res.Allowed == 0 {
		return max(res.RetryAfter, time.Millisecond), nil
	}
	return 0, nil
}

// AllowConversation counts the conversation key against perHour new
// conversations of client, when it is new (seen in no run or upload within
// ttl); it returns how long to wait when that is over.
func (s *Limits) AllowConversation(ctx context.Context, client, key string, perHour int, ttl time.Duration) (time.Duration, error) {
	// A known conversation (every run but its first) is one round trip:
	// its mark's lease renewed. A new one is marked only once admitted, so
	// that a refused one is refused again.
	known, err := s.rdb.Expire(ctx, knownConvKey(key), ttl).Result()
	if err != nil {
		return 0, fmt.Errorf("count conversation: %w", err)
	}
	if known {
		return 0, nil
	}
	if perHour > 0 {
		res, err := s.rate.Allow(ctx, newConvsKey(client), redis_rate.PerHour(perHour))
		if err != nil {
			return 0, fmt.Errorf("count conversation: %w", err)
		}
		if res.Allowed == 0 {
			return max(res.RetryAfter, time.Millisecond), nil
		}
	}
	if err := s.rdb.Set(ctx, knownConvKey(key), 1, ttl).Err(); err != nil {
		return 0, fmt.Errorf("count conversation: %w", err)
	}
	return 0, nil
}

// ActiveRuns returns how many runs of client are queued or running.
func (s *Limits) ActiveRuns(ctx context.Context, client string) (int, error) {
	key := activeRunsKey(client)
	pipe := s.rdb.TxPipeline()
	pipe.ZRemRangeByScore(ctx, key, "-inf", strconv.FormatInt(s.now().UnixMilli(), 10))
	n := pipe.ZCard(ctx, key)
	if _, err := pipe.Exec(ctx); err != nil {
		return 0, fmt.Errorf("count active runs: %w", err)
	}
	return int(n.Val()), nil
}

// RunSeconds returns the wall seconds of client's runs that ended today
// (UTC), and those its runs not yet ended reserve.
func (s *Limits) RunSeconds(ctx context.Context, client string) (used, reserved int64, err error) {
	pipe := s.rdb.Pipeline()
	u := pipe.Get(ctx, runSecondsKey(client, s.now()))
	r := pipe.Get(ctx, reservedKey(client)+":total")
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return 0, 0, fmt.Errorf("read run seconds: %w", err)
	}
	used, _ = u.Int64()
	reserved, _ = r.Int64()
	return used, reserved, nil
}

// AllowConversations counts the conversation keys of a batch that are
// new (seen in no run or upload lately) against perHour new
// conversations of client, all at once; when that is over, it returns
// how long to wait (-1: never, as more are new than an hour allows). The
// batch's script marks them seen.
func (s *Limits) AllowConversations(ctx context.Context, client string, keys []string, perHour int) (time.Duration, error) {
	if perHour <= 0 || len(keys) == 0 {
		return 0, nil
	}
	pipe := s.rdb.Pipeline()
	known := make(map[string]*redis.IntCmd, len(keys))
	for _, k := range keys {
		if _, dup := known[k]; !dup {
			known[k] = pipe.Exists(ctx, knownConvKey(k))
		}
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return 0, fmt.Errorf("count conversations: %w", err)
	}
	n := 0
	for _, c := range known {
		if c.Val() == 0 {
			n++
		}
	}
	switch {
	case n == 0:
		return 0, nil
	case n > perHour:
		return -1, nil
	}
	res, err := s.rate.AllowN(ctx, newConvsKey(client), redis_rate.PerHour(perHour), n)
	if err != nil {
		return 0, fmt.Errorf("count conversations: %w", err)
	}
	if res.Allowed < n {
		return max(res.RetryAfter, time.Millisecond), nil
	}
	return 0, nil
}
