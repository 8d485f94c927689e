package sandbox

import (
	"math"
	"sync"
	"time"

	"github.com/jonboulle/clockwork"
)

// demandWindow is how far back demand looks at new conversations.
const demandWindow = 10 * time.Second

// rateWindow is the recent past whose rate of new conversations the pool
// also follows.
const rateWindow = time.Second

// defaultLead is how long a sandbox is taken to start until one has been
// timed.
const defaultLead = time.Second

// demand sizes a language's pool from the rate new conversations take
// sandboxes from it, rather than a fixed count. Two needs, the larger
// wins, at least the configured count and at most a ceiling:
//
//   - a repeat of the last window: as many as were taken in the last
//     demandWindow, less those recycled into the pool meanwhile (with more
//     conversations than warm sandboxes, each new one evicts a warm
//     sandbox, which comes back to the pool: a container started for it
//     would only be removed again when a recycled one finds the pool full);
//   - what is taken while a refill is on its way: the rate of the last
//     window times how long a refill takes (lead), so that the pool does
//     not run dry between a take and the refill it sets off, however much
//     recycling brings back. A refill is a start, or, while new
//     conversations find the pool empty and idle sandboxes are reclaimed
//     for them (reclaim.go), a recycle: a reset, a small part of a start.
//
// A language configured with no pool gets none.
type demand struct {
	clock clockwork.Clock
	mu    sync.Mutex
	takes map[string][]time.Time   // by language, oldest first
	backs map[string][]time.Time   // recycled into the pool, by language
	lead  map[string]time.Duration // moving average of start times, by language
	// recycleLead is the moving average of recycle times, by language.
	recycleLead map[string]time.Duration
}

func newDemand(clock clockwork.Clock) *demand {
	return &demand{clock: clock, takes: map[string][]time.Time{}, backs: map[string][]time.Time{},
		lead: map[string]time.Duration{}, recycleLead: map[string]time.Duration{}}
}

// took records that a conversation took a pooled sandbox of lang.
func (d *demand) took(lang string) { d.record(d.takes, lang) }

// recycled records that a sandbox of lang was recycled into the pool, and
// how long that took.
func (d *demand) recycled(lang string, took time.Duration) {
	d.record(d.backs, lang)
	d.average(d.recycleLead, lang, took)
}

// started records how long a sandbox of lang took to start.
func (d *demand) started(lang string, took time.Duration) { d.average(d.lead, lang, took) }

// average folds took into lang's moving average in leads (a quarter
// weight for the newest).
func (d *demand) average(leads map[string]time.Duration, lang string, took time.Duration) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if prev, ok := leads[lang]; ok {
		took = (3*prev + took) / 4
	}
	leads[lang] = took
}

func (d *demand) record(events map[string][]time.Time, lang string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	events[lang] = append(d.prune(events, lang), d.clock.Now())
}

// target returns how many sandboxes of lang the pool should hold;
// byRecycling says that refills are recycles now rather than starts.
func (d *demand) target(lang string, configured, ceiling int, byRecycling bool) int {
	if configured <= 0 {
		return 0
	}
	d.mu.Lock()
	takes := len(d.prune(d.takes, lang))
	net := takes - len(d.prune(d.backs, lang))
	lead, ok := d.lead[lang]
	if recycle, timed := d.recycleLead[lang]; byRecycling && timed {
		lead, ok = recycle, true
	}
	d.mu.Unlock()
	if !ok {
		lead = defaultLead
	}
	rate := float64(takes) / demandWindow.Seconds()
	if byRecycling {
		// Refills as quick as a reset follow the burst as it is now:
		// the window's rate lags behind one that began within it.
		rate = max(rate, d.recentRate(lang))
	}
	inLead := int(math.Ceil(rate * lead.Seconds()))
	return max(configured, min(max(net, inLead), ceiling))
}

// recentRate is the rate of takes over the last rateWindow, per second.
func (d *demand) recentRate(lang string) float64 {
	d.mu.Lock()
	defer d.mu.Unlock()
	ts, from := d.takes[lang], d.clock.Now().Add(-rateWindow)
	n := 0
	for i := len(ts) - 1; i >= 0 && ts[i].After(from); i-- {
		n++
	}
	return float64(n) / rateWindow.Seconds()
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

// poolCeiling is the most sandboxes of a language the pool may hold:
// maxPool (MaxPool), no more than the warm sandboxes the language may
// keep (a pooled sandbox becomes one when a conversation adopts it), and
// no more than fit, at their memory limit each, in budget (a share of the
// host's available memory; no bound if either is 0).
func poolCeiling(maxPool, maxWarm int, budget, perSandbox int64) int {
	n := min(maxPool, maxWarm)
	if budget > 0 && perSandbox > 0 {
		n = min(n, int(budget/perSandbox))
	}
	return max(n, 0)
}
