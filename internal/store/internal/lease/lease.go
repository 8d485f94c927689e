// Package lease keeps a lease in Redis: a key that one holder at a time
// sets for a while, renews, and gives up. The leader (package store) and
// the audit log's sealer (package auditlog) each hold one.
package lease

import (
	"context"
	"time"

	"github.com/redis/go-redis/v9"
)

// Take takes the lease at key for holder, for ttl, if it is free, or
// renews it if holder has it; it reports whether holder holds it.
func Take(ctx context.Context, rdb redis.Scripter, key, holder string, ttl time.Duration) (bool, error) {
	ok, err := takeScript.Run(ctx, rdb, []string{key}, holder, ttl.Milliseconds()).Int()
	return ok == 1, err
}

// Release gives the lease at key up, if holder has it.
func Release(ctx context.Context, rdb redis.Scripter, key, holder string) error {
	return releaseScript.Run(ctx, rdb, []string{key}, holder).Err()
}

// takeScript takes a free lease or renews one's own.
// KEYS[1] lease; ARGV[1] holder, ARGV[2] ttl (ms)
var takeScript = redis.NewScript(`
local cur = redis.call('GET', KEYS[1])
if cur and cur ~= ARGV[1] then return 0 end
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
return 1
`)

// releaseScript gives up one's own lease.
// KEYS[1] lease; ARGV[1] holder
var releaseScript = redis.NewScript(`
if redis.call('GET', KEYS[1]) == ARGV[1] then redis.call('DEL', KEYS[1]) end
return 1
`)
