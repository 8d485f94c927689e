// Package lifecycle gives every long-running background part of the service
// one shape, as River's startstop and asynq's heartbeat and janitor have it:
// a type with Start(ctx) and Stop(), one file each, that owns one goroutine.
//
//	type Janitor struct {
//		lifecycle.Base
//		clock clockwork.Clock
//		...
//	}
//
//	func (j *Janitor) Start(ctx context.Context) error {
//		return j.Base.Run(ctx, lifecycle.Every(j.clock, JanitorInterval, j.Sweep))
//	}
//
// Stop comes from Base. Time comes through a clockwork.Clock, so that tests
// advance a fake clock instead of sleeping.
package lifecycle

import (
	"context"
	"errors"
	"sync"
	"time"

	"github.com/jonboulle/clockwork"
)

// Service is a background part of a process.
type Service interface {
	// Start starts the part's goroutine and returns. The part runs until
	// Stop is called or ctx ends.
	Start(ctx context.Context) error
	// Stop ends the part and returns once its goroutine has. It may be
	// called on a part that never started, and more than once.
	Stop()
}

// ErrStarted reports a Start of a part that is running.
var ErrStarted = errors.New("lifecycle: already started")

// Base runs the one goroutine of a Service. Embed it and call Run from
// Start; its Stop is the part's Stop. The zero Base is ready to use.
type Base struct {
	mu     sync.Mutex
	cancel context.CancelFunc
	done   chan struct{}
}

// Run starts loop in a goroutine, with a context that ends when ctx does
// or Stop is called. It returns ErrStarted while an earlier loop runs.
func (b *Base) Run(ctx context.Context, loop func(ctx context.Context)) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.done != nil {
		select {
		case <-b.done:
		default:
			return ErrStarted
		}
	}
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	b.cancel, b.done = cancel, done
	go func() {
		defer close(done)
		defer cancel()
		loop(ctx)
	}()
	return nil
}

// Stop cancels the loop and waits for it to return.
func (b *Base) Stop() {
	b.mu.Lock()
	cancel, done := b.cancel, b.done
	b.mu.Unlock()
	if cancel == nil {
		return
	}
	cancel()
	<-done
}

// Every returns a loop that calls f every d, by clock, until its context
// ends. The first call is d after the start.
func Every(clock clockwork.Clock, d time.Duration, f func(context.Context)) func(context.Context) {
	return func(ctx context.Context) {
		t := clock.NewTicker(d)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.Chan():
				f(ctx)
			}
		}
	}
}

// Group is parts started in order and stopped in reverse order: a part may
// depend on those before it.
type Group []Service

// Start starts every part. If one fails, those already started are stopped
// and its error returned.
func (g Group) Start(ctx context.Context) error {
	for i, s := range g {
		if err := s.Start(ctx); err != nil {
			g[:i].Stop()
			return err
		}
	}
	return nil
}

// Stop stops every part, the last started first.
func (g Group) Stop() {
	for i := len(g) - 1; i >= 0; i-- {
		g[i].Stop()
	}
}

// Schedule turns a chore into a loop that calls it every d: Periodic on a
// clock, or only while the process leads its deployment
// (leader.Elector.Every).
type Schedule func(d time.Duration, f func(context.Context)) func(context.Context)

// Periodic is the Schedule of Every on clock.
func Periodic(clock clockwork.Clock) Schedule {
	return func(d time.Duration, f func(context.Context)) func(context.Context) { return Every(clock, d, f) }
}
