package executor

import (
	"context"
	"errors"
	"log/slog"
	"runtime"
	"sync"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/runbox-dev/runbox"
	"github.com/runbox-dev/runbox/internal/lifecycle"
	"github.com/runbox-dev/runbox/internal/sandbox"
	"github.com/runbox-dev/runbox/internal/sandbox/engine"
)

// MaxPool bounds the sandboxes of one language that wait in the pool,
// started or recycled, for new conversations: enough for a burst without a
// container start, few enough that idle ones cost little memory.
const MaxPool = 16

// poolRetry is how often the pool is topped up without a wake-up (a failed
// start is tried again).
const poolRetry = 5 * time.Second

// startDelay is how long the starts wait that a new conversation's take
// from the pool calls for: long enough for a burst to show itself — its
// next new conversations find the pool empty (each waits for a slot, then
// for the pool) and recycling serves them, so the pool starts nothing
// (the manager's StartsHeld) — short beside the seconds between sporadic
// new conversations, whose refill comes that much later. It is the
// manager's adoptGrace, what a new conversation that finds nothing on its
// way waits before it starts a sandbox of its own.
const startDelay = 200 * time.Millisecond

// poolStarts bounds the pool's sandboxes starting at once, all languages
// together: one after another a burst outruns the refill, and more than
// the machine has cores only share its CPU (a start is mostly the
// runtime's and the interpreter's CPU time) with the runs under way.
var poolStarts = min(max(runtime.NumCPU(), 2), 8)

// poolFiller keeps sandboxes of each language started, waiting for new
// conversations — as many as the manager's PoolTarget says: the
// configured Pool, more while new conversations come faster — at start,
// whenever a new conversation asks for one (wants), as each start ends,
// and every poolRetry. A refill starts startDelay after the first sandbox
// taken, not once the pool is empty, and several start at once
// (poolStarts); those starting count towards the target; none starts while
// sandboxes come by recycling (the manager's Reclaim), nor while new
// conversations find the pool empty and recycling serves them
// (StartsHeld).
type poolFiller struct {
	lifecycle.Base
	sandboxes poolSandboxes
	slots     slotWorkspace
	runners   []runbox.Runner
	pool      sandbox.WarmLimits
	executor  string          // names the slots
	wants     <-chan struct{} // a new conversation asked for a sandbox
	clock     clockwork.Clock
	log       *slog.Logger
}

func (p *poolFiller) Start(ctx context.Context) error {
	return p.Base.Run(ctx, p.loop)
}

// started is the end of one of the pool's starts.
type started struct {
	language string
	err      error
}

func (p *poolFiller) loop(ctx context.Context) {
	t := p.clock.NewTicker(poolRetry)
	defer t.Stop()
	var (
		wg       sync.WaitGroup
		ended    = make(chan started, poolStarts)
		starting = map[string]int{}  // by language
		failed   = map[string]bool{} // a start failed: none until the next retry
		// full: the engine had no room for a sandbox (engine.ErrNoRoom),
		// of any language: none starts until the next retry. The pool
		// never makes room by removing a conversation's idle sandbox;
		// a run's start does (package sandbox).
		full bool
		// told: the log said so, and no start has succeeded since.
		told bool
		// hold ends the startDelay of a new conversation's take: no
		// start until then. nil when none is under way.
		hold <-chan time.Time
	)
	defer wg.Wait()
	for {
		for _, r := range p.runners {
			lang := r.Language
			if failed[lang] || full {
				continue
			}
			target, pooled := p.sandboxes.PoolTarget(lang, p.pool.For(lang)), p.sandboxes.Pooled(lang)
			coming := p.sandboxes.Reclaim(lang, min(target-pooled-starting[lang], poolStarts))
			if hold != nil || p.sandboxes.StartsHeld(lang) {
				continue
			}
			n := startsWanted(target, pooled, coming, starting[lang], total(starting))
			for range n {
				starting[lang]++
				wg.Go(func() { ended <- started{lang, p.prestart(ctx, lang)} })
			}
		}
		select {
		case <-ctx.Done():
			return
		case s := <-ended:
			starting[s.language]--
			switch {
			case s.err == nil:
				told = false
			case ctx.Err() != nil:
			case errors.Is(s.err, engine.ErrNoRoom):
				// Expected while the conversations' sandboxes fill the
				// engine's room: not a fault, and said once.
				if !told {
					p.log.Info("no room for the pool's sandboxes; trying again later", "language", s.language, "retry", poolRetry, "err", s.err)
				}
				full, told = true, true
			default:
				p.log.Warn("start a sandbox for the pool", "language", s.language, "err", s.err)
				failed[s.language] = true
			}
		case <-p.wants:
			if hold == nil {
				hold = p.clock.After(startDelay)
			}
		case <-hold:
			hold = nil
		case <-t.Chan():
			clear(failed)
			full = false
		}
	}
}

// startsWanted is how many more sandboxes of a language to start now: what
// the target lacks beside those waiting and starting, within the starts
// allowed at once (all languages' starting counted) — none while some come
// by recycling (reclaimed from idle conversations while new ones find the
// pool empty). Those come sooner than a start and cost a reset, not a
// container: on a busy host a start's CPU slows the very runs it is for
// (a burst of new conversations ran 4× faster without them).
func startsWanted(target, pooled, coming, starting, allStarting int) int {
	if coming > 0 {
		return 0
	}
	return max(0, min(target-pooled-starting, poolStarts-allStarting))
}

func total(m map[string]int) int {
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}

func (p *poolFiller) prestart(ctx context.Context, language string) error {
	slot, err := p.slots.NewSlot(NewSlotName(p.executor))
	if err != nil {
		return err
	}
	if err := p.sandboxes.Prestart(ctx, language, slot); err != nil {
		if rerr := p.slots.RemoveSlot(slot); rerr != nil {
			p.log.Warn("remove slot", "err", rerr)
		}
		return err
	}
	return nil
}
