// Package periodic runs the background chores of the service's processes
// (heartbeats, watchdogs, sweeps) on a ticker, and stops them cleanly.
package periodic

import (
	"context"
	"time"
)

// Run calls f every d until ctx ends.
func Run(ctx context.Context, d time.Duration, f func(context.Context)) {
	t := time.NewTicker(d)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			f(ctx)
		}
	}
}

// Start runs f every d in the background until the returned stop is
// called; stop returns once f has returned for the last time.
func Start(d time.Duration, f func(context.Context)) (stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		Run(ctx, d, f)
	}()
	return func() { cancel(); <-done }
}
