package executor

import (
	"sync"

	"github.com/runbox-dev/runbox/internal/link"
	"github.com/runbox-dev/runbox/internal/sandbox"
)

// tailBytes is how much of each stream of a background run the executor
// keeps: the recent output (a dev server's log, its last build), which
// the run's events stop carrying once past SANDBOX_MAX_OUTPUT_BYTES.
const tailBytes = 64 << 10

// tails are the recent output of the background runs running here, by
// run id.
type tails struct {
	mu   sync.Mutex
	runs map[string]*tail
}

func (t *tails) add(run string) *tail {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.runs == nil {
		t.runs = map[string]*tail{}
	}
	tl := &tail{}
	t.runs[run] = tl
	return tl
}

func (t *tails) remove(run string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	delete(t.runs, run)
}

// get returns a run's recent output; false when it does not run here.
func (t *tails) get(run string) (link.Output, bool) {
	t.mu.Lock()
	tl, ok := t.runs[run]
	t.mu.Unlock()
	if !ok {
		return link.Output{}, false
	}
	return tl.output(), true
}

// tail keeps the last tailBytes of each stream.
type tail struct {
	mu             sync.Mutex
	stdout, stderr []byte
	outDropped     int64
	errDropped     int64
}

func (t *tail) write(s sandbox.Stream, p []byte) {
	t.mu.Lock()
	defer t.mu.Unlock()
	buf, dropped := &t.stdout, &t.outDropped
	if s == sandbox.Stderr {
		buf, dropped = &t.stderr, &t.errDropped
	}
	*buf = append(*buf, p...)
	if over := len(*buf) - tailBytes; over > 0 {
		*dropped += int64(over)
		*buf = append((*buf)[:0], (*buf)[over:]...)
	}
}

func (t *tail) output() link.Output {
	t.mu.Lock()
	defer t.mu.Unlock()
	return link.Output{Stdout: string(t.stdout), Stderr: string(t.stderr), StdoutDropped: t.outDropped, StderrDropped: t.errDropped}
}
