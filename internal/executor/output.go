package executor

import (
	"strings"
	"time"
	"unicode/utf8"

	"github.com/runbox-dev/runbox"
	"github.com/runbox-dev/runbox/internal/sandbox"
)

// maxOutputEvents bounds the output events of a run: a program that
// writes a byte at a time would otherwise cost an event (and its overhead
// in Redis) per byte. Past it, output is still kept for the result and
// recorded in one event per stream with the run's end.
const maxOutputEvents = 1000

// output keeps the first max bytes of each stream for the result and
// publishes them as events as they come, each event ending on a whole
// UTF-8 character. Beyond max, output is counted and flagged, not kept and
// not published: the event log of a run stays bounded in bytes, and by
// maxOutputEvents in events.
type output struct {
	stdout, stderr capped
	publish        func(...runbox.Event)
	events         int // output events published
}

func newOutput(max int, publish func(...runbox.Event)) *output {
	return &output{
		stdout:  capped{max: max, typ: runbox.EventStdout},
		stderr:  capped{max: max, typ: runbox.EventStderr},
		publish: publish,
	}
}

func (o *output) write(s sandbox.Stream, p []byte) {
	c := &o.stdout
	if s == sandbox.Stderr {
		c = &o.stderr
	}
	data := c.add(p)
	switch {
	case data == "":
	case o.events >= maxOutputEvents:
		c.published -= len(data) // held for flush
	default:
		o.events++
		o.publish(runbox.Event{TS: time.Now(), Type: c.typ, Data: data})
	}
}

// rest returns what is held back — the end of a character cut short,
// or what came past maxOutputEvents — as events, for the run's end to
// record with the rest of its final events.
func (o *output) rest() []runbox.Event {
	var evs []runbox.Event
	for _, c := range []*capped{&o.stdout, &o.stderr} {
		if rest := c.kept[c.published:]; len(rest) > 0 {
			c.published = len(c.kept)
			evs = append(evs, runbox.Event{TS: time.Now(), Type: c.typ, Data: string(rest)})
		}
	}
	return evs
}

type capped struct {
	typ       string
	max       int
	kept      []byte
	published int // bytes of kept already published
	total     int64
	truncated bool
}

// add keeps what fits and returns the newly publishable text.
func (c *capped) add(p []byte) string {
	c.total += int64(len(p))
	room := c.max - len(c.kept)
	if len(p) > room {
		p = p[:max(room, 0)]
		c.truncated = true
	}
	c.kept = append(c.kept, p...)
	pending := c.kept[c.published:]
	n := len(pending)
	if !c.truncated {
		n = completePrefix(pending)
	}
	c.published += n
	return string(pending[:n])
}

// text returns what was kept, as valid UTF-8, and whether some was cut.
func (c *capped) text() (string, bool) {
	return strings.ToValidUTF8(string(c.kept), "\uFFFD"), c.truncated
}

// completePrefix returns the length of b without a trailing incomplete
// UTF-8 sequence.
func completePrefix(b []byte) int {
	for i := len(b) - 1; i >= 0 && i >= len(b)-utf8.UTFMax; i-- {
		if utf8.RuneStart(b[i]) {
			if !utf8.FullRune(b[i:]) {
				return i
			}
			break
		}
	}
	return len(b)
}
