package webhooks

import (
	"math/rand/v2"
	"net/url"
	"slices"
	"sync"
	"time"

	"github.com/jonboulle/clockwork"
)

// An api delivers webhooks with a pool of workers (queue.WebhookConcurrency)
// fed by asynq's one queue "webhooks", first come, first served. Left so,
// one client whose receiver never answers would hold every worker for
// AttemptTimeout per webhook, and every other client's webhooks would
// wait behind its thousands. So a webhook is attempted only when
//
//   - its client has fewer than Options.PerClient attempts under way in
//     this api (WEBHOOK_CONCURRENCY_PER_CLIENT): its lane; and
//   - its target — the client's callback host and port — is not failing:
//     after circuitFailures failures in a row (no connection, a timeout,
//     a 5xx or a 429) its circuit opens for a cool-down, twice the last
//     each time it opens again (2×WEBHOOK_BACKOFF … maxCooldown); once that
//     has passed, one attempt probes the target, and an answer closes the
//     circuit. Circuits are per client as well as per host, so that no
//     client can open one on a host another client's receiver shares.
//
// Otherwise the webhook is deferred: its worker hands it back to asynq at
// once, as a retry not counted as one (queue.WebhookHandler), to come back
// when a place is likely free — the circuit's end, or the lane's next slot,
// spaced by how long the client's attempts take — rather than hold a
// worker or go round the queue before it could be sent. Nothing is
// attempted, so nothing else changes: its webhook-id, its record, its
// attempts and its retries' clock; and asynq keeps it as it keeps any
// retry (a crash loses nothing, delivers nothing twice). A webhook whose
// time (WEBHOOK_RETRY_FOR) would end while its circuit is open is not
// deferred past it: it has its last attempt, and is given up as before.
//
// The state is each api's own, in memory: N apis let a client hold
// N×PerClient of their N×WebhookConcurrency workers, and each api opens a
// circuit after its own failures. Asking for a delivery again makes a
// webhook pending but passes the same gate: a redelivery cannot skip a
// circuit's cool-down or a lane's bound (nor a retry's back-off:
// queue.Webhooks.Requeue leaves a waiting retry at its time).
const (
	// DefaultPerClient is WEBHOOK_CONCURRENCY_PER_CLIENT's default.
	DefaultPerClient = 4
	// circuitFailures opens a target's circuit: failures in a row.
	circuitFailures = 5
	// maxCooldown bounds an open circuit's cool-down.
	maxCooldown = 10 * time.Minute
	// minGap and maxDefer bound the spacing of a busy lane's deferred
	// webhooks, and how far ahead one is deferred.
	minGap   = 100 * time.Millisecond
	maxDefer = 5 * time.Minute
	// maxCircuits bounds the targets remembered: past it, those that
	// have not failed for maxCooldown are forgotten.
	maxCircuits = 4096
)

// Why a webhook was deferred (runbox_webhook_deferred_total's reason).
const (
	deferredBusy    = "client_busy"
	deferredCircuit = "circuit_open"
)

// health is what an attempt told of its target.
type health int

const (
	untried  health = iota // nothing was sent (the callback is no longer allowed, …)
	answered               // the receiver answered (any status but 5xx and 429)
	failing                // no answer in time, no connection, 5xx or 429
)

// target is where a client's webhooks go: the client and the callback's
// host and port.
type target struct{ client, host string }

// lane is a client's share of this api's workers.
type lane struct {
	started []time.Time   // the attempts under way, oldest first
	took    time.Duration // how long its attempts take, smoothed
	next    time.Time     // the last slot a deferred webhook was given
}

// circuit is a target's failures.
type circuit struct {
	failures int       // in a row
	opened   int       // times opened in a row: the cool-down doubles
	until    time.Time // open until; zero: it has not opened
	probing  bool      // an attempt probes it, half-open
	last     time.Time // its last failure
}

// pass is an attempt let through; fairness.done gives it back.
type pass struct {
	t     target
	start time.Time
	probe bool
}

// fairness shares an api's workers between clients, and keeps failing
// targets from holding them.
type fairness struct {
	perClient int
	attempt   time.Duration // AttemptTimeout
	backoff   time.Duration // WEBHOOK_BACKOFF
	clock     clockwork.Clock
	jitter    func(time.Duration) time.Duration // in [0, d)

	mu       sync.Mutex
	lanes    map[string]*lane
	circuits map[target]*circuit
}

func newFairness(o Options) *fairness {
	return &fairness{perClient: o.PerClient, attempt: o.AttemptTimeout, backoff: o.Backoff, clock: o.Clock,
		jitter: func(d time.Duration) time.Duration {
			if d <= 0 {
				return 0
			}
			return rand.N(d)
		},
		lanes: map[string]*lane{}, circuits: map[target]*circuit{}}
}

// hostOf is the host and port a callback URL (as checked) goes to.
func hostOf(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return ""
	}
	return u.Host
}

// take lets an attempt of a webhook of client to callback url through,
// or says how long to defer it and why. deadline is when the webhook's
// time ends: no circuit defers it past that.
func (f *fairness) take(client, url string, deadline time.Time) (*pass, time.Duration, string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	now := f.clock.Now()
	t := target{client, hostOf(url)}
	probe := false
	if c := f.circuits[t]; c != nil && !c.until.IsZero() {
		var wait time.Duration
		switch {
		case now.Before(c.until):
			wait = c.until.Sub(now) + f.jitter(max(time.Second, f.cooldown(c.opened)/4))
		case c.probing:
			wait = f.attempt + f.jitter(time.Second)
		default:
			probe = true
		}
		if wait > 0 && !now.Add(wait).After(deadline) {
			return nil, wait, deferredCircuit
		}
	}
	l := f.lanes[client]
	if l == nil {
		l = &lane{}
		f.lanes[client] = l
	}
	if len(l.started) >= f.perClient {
		return nil, f.slot(l, now), deferredBusy
	}
	l.started = append(l.started, now)
	if probe {
		f.circuits[t].probing = true
	}
	return &pass{t: t, start: now, probe: probe}, 0, ""
}

// slot gives a webhook of a busy lane the lane's next slot and returns
// how far ahead it is: slots are spaced by the time the client's attempts
// take (smoothed, or the oldest under way's if longer) shared by its
// places, so that a client with many webhooks waiting sees each come back
// about when it could be sent, not all of them at once.
func (f *fairness) slot(l *lane, now time.Time) time.Duration {
	est := l.took
	if len(l.started) > 0 {
		est = max(est, now.Sub(l.started[0]))
	}
	gap := max(minGap, min(est, f.attempt)/time.Duration(f.perClient))
	next := l.next
	if next.Before(now) {
		next = now
	}
	next = next.Add(gap)
	if limit := now.Add(maxDefer); next.After(limit) {
		next = limit
	}
	l.next = next
	return next.Sub(now)
}

// cooldown is how long a circuit opened n times in a row stays open.
func (f *fairness) cooldown(n int) time.Duration {
	d := 2 * f.backoff
	for range min(n-1, 20) {
		if d *= 2; d >= maxCooldown {
			break
		}
	}
	return min(d, maxCooldown)
}

// done gives p back, with what its attempt told of its target.
func (f *fairness) done(p *pass, h health) {
	f.mu.Lock()
	defer f.mu.Unlock()
	now := f.clock.Now()
	if l := f.lanes[p.t.client]; l != nil {
		if i := slices.Index(l.started, p.start); i >= 0 {
			l.started = slices.Delete(l.started, i, i+1)
		}
		if took := now.Sub(p.start); l.took == 0 {
			l.took = took
		} else {
			l.took += (took - l.took) / 4
		}
		if len(l.started) == 0 && !l.next.After(now) {
			delete(f.lanes, p.t.client)
		}
	}
	c := f.circuits[p.t]
	switch {
	case h == answered:
		delete(f.circuits, p.t)
		return
	case h == untried:
		if c != nil && p.probe {
			c.probing = false
		}
		return
	case c == nil:
		f.forget(now)
		c = &circuit{}
		f.circuits[p.t] = c
	}
	c.failures++
	c.last = now
	if p.probe {
		c.probing = false
	}
	// It opens at its circuitFailures-th failure in a row; a failed probe
	// opens it again, for twice as long. Other failures (attempts that
	// were under way as it opened, last attempts) leave it as it is.
	if c.failures >= circuitFailures && (c.until.IsZero() || p.probe) {
		c.opened++
		c.until = now.Add(f.cooldown(c.opened))
	}
}

// forget keeps the circuits remembered within maxCircuits: past it, those
// whose last failure is older than maxCooldown go.
func (f *fairness) forget(now time.Time) {
	if len(f.circuits) < maxCircuits {
		return
	}
	for t, c := range f.circuits {
		if !c.probing && now.Sub(c.last) > maxCooldown {
			delete(f.circuits, t)
		}
	}
}
