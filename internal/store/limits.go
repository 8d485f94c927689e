package store

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/go-redis/redis_rate/v10"
	"github.com/redis/go-redis/v9"

	"github.com/runbox-dev/runbox"
)

// Limits counts what clients may do: calls a minute and new conversations
// an hour (redis_rate), runs queued or running at once, and run seconds a
// day. A run's end lets in what waits in its client's gate (batches).
type Limits struct {
	*base
	rate    *redis_rate.Limiter
	batches *Batches
}

// The tiers' limits are counted in Redis, so that every api replica
// shares them: calls and new conversations with GCRA (redis_rate), the
// runs a client has queued or running in a sorted set, run seconds in a
// counter per day.

func callsKey(client string) string      { return "calls:" + client } // redis_rate adds its prefix
func newConvsKey(client string) string   { return "convs:" + client }
func activeRunsKey(client string) string { return prefix + "client:" + client + ":active" }
func runSecondsKey(client string, day time.Time) string {
	return prefix + "client:" + client + ":runsec:" + day.UTC().Format("20060102")
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
// (UTC).
func (s *Limits) RunSeconds(ctx context.Context, client string) (int64, error) {
	n, err := s.rdb.Get(ctx, runSecondsKey(client, s.now())).Int64()
	if err == redis.Nil {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("read run seconds: %w", err)
	}
	return n, nil
}

// runStarted counts a new run of the conversation key as active.
func (s *Limits) runStarted(ctx context.Context, key, id string) error {
	client, _, _ := runbox.ParseConversationKey(key)
	pipe := s.rdb.TxPipeline()
	pipe.ZAdd(ctx, activeRunsKey(client), redis.Z{Score: float64(s.now().Add(activeRunHorizon).UnixMilli()), Member: id})
	pipe.Expire(ctx, activeRunsKey(client), activeRunHorizon)
	_, err := pipe.Exec(ctx)
	return err
}

// runEnded takes an ended run off its client's active runs and adds its
// wall time to the client's day; runs waiting in the client's gate
// (batches) take the place it leaves.
func (s *Limits) runEnded(ctx context.Context, key, id string, took time.Duration) error {
	client, _, _ := runbox.ParseConversationKey(key)
	pipe := s.rdb.TxPipeline()
	pipe.ZRem(ctx, activeRunsKey(client), id)
	if secs := int64((took + time.Second - 1) / time.Second); secs > 0 {
		day := runSecondsKey(client, s.now())
		pipe.IncrBy(ctx, day, secs)
		pipe.Expire(ctx, day, 48*time.Hour)
	}
	waiting := pipe.LLen(ctx, gateKey(client))
	if _, err := pipe.Exec(ctx); err != nil {
		return err
	}
	if waiting.Val() > 0 {
		_, err := s.batches.release(ctx, client)
		return err
	}
	return nil
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
