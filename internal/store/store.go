// Package store keeps the state that api and executors share in Redis, by
// aggregate, each a type with its scripts beside it, all on one
// connection (Conn):
//
//   - Runs: runs, their event logs, their conversations' queues, claims
//     and leases, cancellations and input;
//   - Conversations: busy and closed conversations, forks' marks and
//     claims, files' versions, kept interpreters' state;
//   - Executors: the registry of executors, the conversations each
//     holds, dead ones' release, wake-ups, and the leader;
//   - Sessions: MCP sessions and their executions;
//   - Limits: rate limits, active runs and run seconds per client;
//   - Webhooks: the outbox and deliveries of webhooks;
//   - Batches: batches of runs and the clients' gates;
//   - Git, Previews, Projects: the git tools' branches, preview URLs,
//     projects;
//   - E2B: E2B sandboxes' records.
//
// Store holds them all. Consumers declare the few methods they use; a
// consumer that needs one aggregate is given it (st.Runs), one that needs
// several is given the Store, whose embedded aggregates' methods it has.
package store

import (
	"time"

	"github.com/go-redis/redis_rate/v10"
	"github.com/redis/go-redis/v9"
)

// DefaultRetention is how long a run's record and events are kept.
const DefaultRetention = 24 * time.Hour

// base is what every aggregate shares: the connection, the clock and how
// long runs are kept.
type base struct {
	conn      *Conn
	rdb       redis.UniversalClient
	retention time.Duration
	now       func() time.Time
}

// SetClock has the store take the time from now (an injected clock)
// where it records when something happened. Call it before use.
func (b *base) SetClock(now func() time.Time) { b.now = now }

// Retention is how long runs and their traces are kept.
func (b *base) Retention() time.Duration { return b.retention }

func (b *base) ttlSeconds() int64 { return int64(b.retention / time.Second) }

// Store holds the aggregates on one connection.
type Store struct {
	*base
	*Runs
	*Conversations
	*Executors
	*Sessions
	*Limits
	*Webhooks
	*Batches
	*Git
	*Previews
	*Projects
	*E2B
}

// New returns a Store on c.
func New(c *Conn) *Store {
	b := &base{conn: c, rdb: c.rdb, retention: DefaultRetention, now: time.Now}
	limits := &Limits{base: b, rate: redis_rate.NewLimiter(c.rdb)}
	return &Store{
		base:          b,
		Runs:          &Runs{b},
		Conversations: &Conversations{b},
		Executors:     &Executors{b},
		Sessions:      &Sessions{b},
		Limits:        limits,
		Webhooks:      &Webhooks{b},
		Batches:       &Batches{b},
		Git:           &Git{b},
		Previews:      &Previews{b},
		Projects:      &Projects{b},
		E2B:           &E2B{b},
	}
}
