package executor

import (
	"sync"
	"time"

	"github.com/jonboulle/clockwork"
)

// demandWindow is how far back demand looks at new conversations.
const demandWindow = 10 * time.Second

// demand sizes the pool of pre-started sandboxes from the rate new
// conversations take them, rather than a fixed count: as many as were
// taken in the last demandWindow — what a burst like the last one needs
// while the pool refills — at least the configured count and at most a
// ceiling. A language configured with no pool gets none.
type demand struct {
	clock clockwork.Clock
	mu    sync.Mutex
	takes map[string][]time.Time // by language, oldest first
}

func newDemand(clock clockwork.Clock) *demand {
	return &demand{clock: clock, takes: map[string][]time.Time{}}
}

// took records that a conversation took a pooled sandbox of lang.
func (d *demand) took(lang string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.takes[lang] = append(d.prune(lang), d.clock.Now())
}

// target returns how many sandboxes of lang the pool should hold.
func (d *demand) target(lang string, configured, ceiling int) int {
	if configured <= 0 {
		return 0
	}
	d.mu.Lock()
	n := len(d.prune(lang))
	d.mu.Unlock()
	return max(configured, min(n, ceiling))
}

// prune drops the takes older than the window; the caller holds d.mu.
func (d *demand) prune(lang string) []time.Time {
	ts := d.takes[lang]
	from := d.clock.Now().Add(-demandWindow)
	i := 0
	for i < len(ts) && ts[i].Before(from) {
		i++
	}
	d.takes[lang] = ts[i:]
	return d.takes[lang]
}
