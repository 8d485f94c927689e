package executor

import (
	"context"
	"log/slog"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/runbox-dev/runbox/internal/store"
)

// Back-off of the writes the store could not take: the first try again
// soon, then no more than a second apart, so that once Redis is back (a
// restart takes seconds) a run's end is recorded, and its lease renewed,
// before the watchdog — which looks every second — finds the lease
// expired.
const (
	retryFirst = 50 * time.Millisecond
	retryMost  = time.Second
)

// retry tries writes again while the store cannot be reached or cannot
// serve yet (store.Transient): a Redis that restarts, crashes or fails
// over must not lose what a run did. It waits on clock between tries,
// first first, then twice as long each time, up to most.
type retry struct {
	clock       clockwork.Clock
	first, most time.Duration
}

// wait is how long to wait after the nth failed try (n from 1).
func (r retry) wait(n int) time.Duration {
	d := r.first
	for ; n > 1 && d < r.most; n-- {
		d *= 2
	}
	return min(d, r.most)
}

// do calls op until it succeeds or fails otherwise than transiently, and
// returns its last error. It gives up once ctx is done or stop closes (a
// nil stop never does): tries under way are not cut short, and op is
// always tried once. o hears of the outage.
func (r retry) do(ctx context.Context, stop <-chan struct{}, o *outage, op func(context.Context) error) error {
	for n := 1; ; n++ {
		err := op(ctx)
		if !store.Transient(err) {
			o.over(r.clock.Now())
			return err
		}
		o.failed(r.clock.Now(), err)
		t := r.clock.NewTimer(r.wait(n))
		select {
		case <-t.Chan():
		case <-ctx.Done():
			t.Stop()
			return err
		case <-stop:
			t.Stop()
			return err
		}
	}
}

// outage logs that the store cannot be reached once as it begins, and
// once as it ends, however many tries fail in between: what the
// executor was doing (what), for how long, and how many tries it took.
// It is not safe for concurrent use.
type outage struct {
	log   *slog.Logger
	what  string
	since time.Time // of the first failed try
	tries int       // that failed; 0 while the store answers
}

func (o *outage) failed(now time.Time, err error) {
	if o.tries == 0 {
		o.since = now
		o.log.Warn(o.what+": the store cannot be reached; trying again until it can", "err", err)
	}
	o.tries++
}

func (o *outage) over(now time.Time) {
	if o.tries == 0 {
		return
	}
	o.log.Info(o.what+": the store answers again", "after", now.Sub(o.since).Round(time.Millisecond), "tries", o.tries+1)
	o.tries = 0
}
