package executor

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/runbox-dev/runbox/internal/lifecycle"
	"github.com/runbox-dev/runbox/internal/link"
	"github.com/runbox-dev/runbox/internal/sandbox"
)

// A background run (runbox.Spec.Background: a server) is watched here:
// its recent output stays readable (a dev server's log, its last build),
// which the run's events stop carrying once past SANDBOX_MAX_OUTPUT_BYTES,
// and it ends once idle — no output and no preview traffic — for
// Config.ServerIdle.

// tailBytes is how much of each stream of a background run is kept.
const tailBytes = 64 << 10

// errIdle is the cause of ending a background run that went idle.
var errIdle = errors.New("idle")

// backgrounds are the background runs running here, by run id.
type backgrounds struct {
	mu   sync.Mutex
	runs map[string]*background
}

func (b *backgrounds) add(run, conv string, now time.Time) *background {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.runs == nil {
		b.runs = map[string]*background{}
	}
	bg := &background{conv: conv, active: now}
	b.runs[run] = bg
	return bg
}

func (b *backgrounds) remove(run string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	delete(b.runs, run)
}

// get returns a background run running here, or nil.
func (b *backgrounds) get(run string) *background {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.runs[run]
}

// output returns a run's recent output; false when it does not run here.
func (b *backgrounds) output(run string) (link.Output, bool) {
	b.mu.Lock()
	bg, ok := b.runs[run]
	b.mu.Unlock()
	if !ok {
		return link.Output{}, false
	}
	return bg.output(), true
}

// touch marks the background runs of a conversation active at now: a
// preview reached its sandbox.
func (b *backgrounds) touch(conv string, now time.Time) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, bg := range b.runs {
		if bg.conv == conv {
			bg.touch(now)
		}
	}
}

// background is one background run: its recent output, and when it was
// last active.
type background struct {
	conv           string
	mu             sync.Mutex
	stdout, stderr []byte
	outDropped     int64
	errDropped     int64
	active         time.Time
}

func (bg *background) touch(now time.Time) {
	bg.mu.Lock()
	bg.active = now
	bg.mu.Unlock()
}

func (bg *background) write(s sandbox.Stream, p []byte, now time.Time) {
	bg.mu.Lock()
	defer bg.mu.Unlock()
	bg.active = now
	buf, dropped := &bg.stdout, &bg.outDropped
	if s == sandbox.Stderr {
		buf, dropped = &bg.stderr, &bg.errDropped
	}
	*buf = append(*buf, p...)
	if over := len(*buf) - tailBytes; over > 0 {
		*dropped += int64(over)
		*buf = append((*buf)[:0], (*buf)[over:]...)
	}
}

func (bg *background) output() link.Output {
	bg.mu.Lock()
	defer bg.mu.Unlock()
	return link.Output{Stdout: string(bg.stdout), Stderr: string(bg.stderr), StdoutDropped: bg.outDropped, StderrDropped: bg.errDropped}
}

func (bg *background) idleSince() time.Time {
	bg.mu.Lock()
	defer bg.mu.Unlock()
	return bg.active
}

// watchIdle ends a background run (cancel with errIdle) once it has been
// idle for Config.ServerIdle.
func (e *Executor) watchIdle(ctx context.Context, bg *background, cancel context.CancelCauseFunc) (stop func()) {
	ctx, stopCtx := context.WithCancel(ctx)
	done := make(chan struct{})
	idle := e.cfg.ServerIdle
	go func() {
		defer close(done)
		lifecycle.Every(e.cfg.Clock, min(idle/10, 30*time.Second), func(context.Context) {
			if e.cfg.Clock.Since(bg.idleSince()) >= idle {
				cancel(errIdle)
				stopCtx()
			}
		})(ctx)
	}()
	return func() { stopCtx(); <-done }
}

// idleMessage says why an idle background run ended.
func (e *Executor) idleMessage() string {
	return fmt.Sprintf("the background program was idle (no output, no preview traffic) for %s and was stopped", e.cfg.ServerIdle)
}
