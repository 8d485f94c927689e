package commands

import (
	"fmt"
	"strings"
	"time"

	"github.com/runbox-dev/runbox"
)

// Event is one entry of an execution's output, as the streaming sandbox
// server's clients read it.
type Event struct {
	Type string  `json:"type" jsonschema:"ready, stdout, stderr, exit, timeout, error, cancelled or truncated"`
	TS   float64 `json:"ts" jsonschema:"Unix time in seconds"`
	// Data is one line of output, without its newline (stdout, stderr).
	Data *string `json:"data,omitempty"`
	// Code and DurationMS come with exit.
	Code       *int   `json:"code,omitempty"`
	DurationMS *int64 `json:"duration_ms,omitempty"`
	// TimeoutSeconds comes with timeout.
	TimeoutSeconds *int `json:"timeout_seconds,omitempty"`
	// Message comes with error and truncated.
	Message string `json:"message,omitempty"`
	// Stream is the stream truncated speaks of.
	Stream string `json:"stream,omitempty"`
}

// Event types beyond runbox's own.
const (
	eventReady     = "ready"
	eventTruncated = "truncated"
)

// maxLineEvents bounds the output lines an execution's output lists; a
// program that prints many short lines would otherwise cost an object
// each. Past it a truncated event says so.
const maxLineEvents = 10000

// converter turns a run's event log into an execution's output: one
// event per line, a partial line held until its end comes (or the run
// ends), markers where output was not kept.
type converter struct {
	timeoutSeconds int
	result         *runbox.Result // the run's, once it has ended
	out            []Event
	partial        [2]strings.Builder // stdout, stderr
	lines          int
	cut            bool // maxLineEvents reached
	ended          bool // a terminal event was converted
}

// convert returns the output of an execution whose run logged evs; its
// done event, once logged, carries the run's result.
func convert(evs []runbox.Event, timeoutSeconds int) []Event {
	var res *runbox.Result
	if n := len(evs); n > 0 && evs[n-1].Type == runbox.EventDone {
		res = evs[n-1].Result
	}
	c := &converter{timeoutSeconds: timeoutSeconds, result: res, out: []Event{}}
	for _, ev := range evs {
		c.add(ev)
	}
	if res != nil && !c.ended {
		// Ended without a terminal event of its own.
		c.flush(evs[len(evs)-1].TS)
	}
	return c.out
}

func (c *converter) add(ev runbox.Event) {
	ts := unix(ev.TS)
	switch ev.Type {
	case runbox.EventStarted:
		c.out = append(c.out, Event{Type: eventReady, TS: ts})
	case runbox.EventStdout:
		c.write(0, ev)
	case runbox.EventStderr:
		c.write(1, ev)
	case runbox.EventExit:
		c.flush(ev.TS)
		e := Event{Type: runbox.EventExit, TS: ts, Code: ev.ExitCode, DurationMS: ev.DurationMS}
		c.end(e)
	case runbox.EventTimeout:
		c.flush(ev.TS)
		secs := c.timeoutSeconds
		c.end(Event{Type: runbox.EventTimeout, TS: ts, TimeoutSeconds: &secs})
	case runbox.EventCancelled:
		c.flush(ev.TS)
		c.end(Event{Type: runbox.EventCancelled, TS: ts})
	case runbox.EventError:
		c.flush(ev.TS)
		c.end(Event{Type: runbox.EventError, TS: ts, Message: ev.Message})
	}
}

// write splits a chunk of a stream into lines.
func (c *converter) write(stream int, ev runbox.Event) {
	data := ev.Data
	for {
		line, rest, found := strings.Cut(data, "\n")
		if !found {
			c.partial[stream].WriteString(line)
			return
		}
		if c.partial[stream].Len() > 0 {
			c.partial[stream].WriteString(line)
			line = c.partial[stream].String()
			c.partial[stream].Reset()
		}
		// A line's time is when it was complete: events then stay in
		// order, a line held across chunks of the other stream too.
		c.line(stream, line, ev.TS)
		data = rest
	}
}

// flush ends the partial lines: the output is over.
func (c *converter) flush(at time.Time) {
	for stream := range c.partial {
		if c.partial[stream].Len() > 0 {
			c.line(stream, c.partial[stream].String(), at)
			c.partial[stream].Reset()
		}
	}
	if c.result == nil {
		return
	}
	ts := unix(at)
	if c.result.StdoutTruncated {
		c.out = append(c.out, Event{Type: eventTruncated, TS: ts, Stream: runbox.EventStdout,
			Message: "stdout past the output limit was not kept"})
	}
	if c.result.StderrTruncated {
		c.out = append(c.out, Event{Type: eventTruncated, TS: ts, Stream: runbox.EventStderr,
			Message: "stderr past the output limit was not kept"})
	}
}

func (c *converter) line(stream int, line string, ts time.Time) {
	if c.cut {
		return
	}
	if c.lines >= maxLineEvents {
		c.cut = true
		c.out = append(c.out, Event{Type: eventTruncated, TS: unix(ts),
			Message: fmt.Sprintf("output past %d lines is not listed", maxLineEvents)})
		return
	}
	c.lines++
	typ := runbox.EventStdout
	if stream == 1 {
		typ = runbox.EventStderr
	}
	c.out = append(c.out, Event{Type: typ, TS: unix(ts), Data: &line})
}

func (c *converter) end(e Event) {
	if !c.ended {
		c.ended = true
		c.out = append(c.out, e)
	}
}

// unix is t in Unix seconds.
func unix(t time.Time) float64 { return float64(t.UnixNano()) / 1e9 }
