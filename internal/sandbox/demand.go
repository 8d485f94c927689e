package sandbox

import (
	"sync"
	"time"

	"github.com/jonboulle/clockwork"
)

// demandWindow is how far back demand looks at new conversations.
const demandWindow = 10 * time.Second

// demand sizes a language's pool from the rate new conversations take
// sandboxes from it, rather than a fixed count: as many as were taken in
// the last demandWindow — what a burst like the last one needs while the
// pool refills — less those recycled into it meanwhile (with more
// conversations than warm sandboxes, each new one evicts a warm sandbox,
// which comes back to the pool: a container started for it would only be
// removed again when a recycled one finds the pool full), at least the
// configured count and at most a ceiling. A language configured with no
// pool gets none.
type demand struct {
	clock clockwork.Clock
	mu    sync.Mutex
	takes map[string][]time.Time // by language, oldest first
	backs map[string][]time.Time // recycled into the pool, by language
}

func newDemand(clock clockwork.Clock) *demand {
	return &demand{clock: clock, takes: map[string][]time.Time{}, backs: map[string][]time.Time{}}
}

// took records that a conversation took a pooled sandbox of lang.
func (d *demand) took(lang string) { d.record(d.takes, lang) }

// returned records that a sandbox of lang was recycled into the pool.
func (d *demand) returned(lang string) { d.record(d.backs, lang) }

func (d *demand) record(events map[string][]time.Time, lang string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	events[lang] = append(d.prune(events, lang), d.clock.Now())
}

// target returns how many sandboxes of lang the pool should hold.
func (d *demand) target(lang string, configured, ceiling int) int {
	if configured <= 0 {
		return 0
	}
	d.mu.Lock()
	n := len(d.prune(d.takes, lang)) - len(d.prune(d.backs, lang))
	d.mu.Unlock()
	return max(configured, min(n, ceiling))
}

// prune drops the events older than the window; the caller holds d.mu.
func (d *demand) prune(events map[string][]time.Time, lang string) []time.Time {
	ts := events[lang]
	from := d.clock.Now().Add(-demandWindow)
	i := 0
	for i < len(ts) && ts[i].Before(from) {
		i++
	}
	events[lang] = ts[i:]
	return events[lang]
}
