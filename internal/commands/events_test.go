package commands

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/runbox-dev/runbox"
)

func intp(n int) *int       { return &n }
func int64p(n int64) *int64 { return &n }

// line is an event as compared in tests: its type and data.
func brief(evs []Event) []string {
	out := make([]string, 0, len(evs))
	for _, e := range evs {
		s := e.Type
		switch {
		case e.Data != nil:
			s += ":" + *e.Data
		case e.Code != nil:
			s += ":" + string(rune('0'+*e.Code))
		case e.Stream != "":
			s += ":" + e.Stream
		}
		out = append(out, s)
	}
	return out
}

func TestConvert(t *testing.T) {
	t0 := time.Unix(1700000000, 0)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	ev := func(ms int, typ, data string) runbox.Event { return runbox.Event{TS: at(ms), Type: typ, Data: data} }
	exit := runbox.Event{TS: at(90), Type: runbox.EventExit, ExitCode: intp(3), DurationMS: int64p(80)}
	done := func(r runbox.Result) runbox.Event {
		return runbox.Event{TS: at(95), Type: runbox.EventDone, Result: &r}
	}
	tests := []struct {
		name string
		evs  []runbox.Event
		want []string
	}{
		{"queued only", []runbox.Event{ev(0, runbox.EventQueued, "")}, []string{}},
		{"lines, split across chunks, a partial one held while running",
			[]runbox.Event{ev(0, runbox.EventQueued, ""), ev(1, runbox.EventStarted, ""),
				ev(2, runbox.EventStdout, "a\nb"), ev(3, runbox.EventStderr, "err\n"), ev(4, runbox.EventStdout, "c\n\nd")},
			[]string{"ready", "stdout:a", "stderr:err", "stdout:bc", "stdout:"}},
		{"a partial last line flushed at the exit",
			[]runbox.Event{ev(1, runbox.EventStarted, ""), ev(2, runbox.EventStdout, "x\ny"), exit, done(runbox.Result{ExitCode: 3})},
			[]string{"ready", "stdout:x", "stdout:y", "exit:3"}},
		{"truncated streams are marked before the end",
			[]runbox.Event{ev(1, runbox.EventStarted, ""), ev(2, runbox.EventStdout, "x"), exit,
				done(runbox.Result{StdoutTruncated: true, StderrTruncated: true})},
			[]string{"ready", "stdout:x", "truncated:stdout", "truncated:stderr", "exit:3"}},
		{"timeout", []runbox.Event{ev(1, runbox.EventStarted, ""), ev(2, runbox.EventStdout, "t\n"),
			{TS: at(3), Type: runbox.EventTimeout, Message: "ran too long"}, done(runbox.Result{TimedOut: true})},
			[]string{"ready", "stdout:t", "timeout"}},
		{"cancelled", []runbox.Event{ev(1, runbox.EventStarted, ""), {TS: at(3), Type: runbox.EventCancelled}, done(runbox.Result{})},
			[]string{"ready", "cancelled"}},
		{"error", []runbox.Event{{TS: at(3), Type: runbox.EventError, Message: "the sandbox failed"}, done(runbox.Result{})},
			[]string{"error"}},
		{"events outside the contract are left out",
			[]runbox.Event{ev(1, runbox.EventStarted, ""), {TS: at(2), Type: runbox.EventEgress, Egress: &runbox.Egress{Host: "x"}},
				ev(3, runbox.EventDetached, ""), exit, done(runbox.Result{})},
			[]string{"ready", "exit:3"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out := convert(tt.evs, 60)
			if got := brief(out); strings.Join(got, "|") != strings.Join(tt.want, "|") {
				t.Fatalf("got %q\nwant %q", got, tt.want)
			}
			for i := 1; i < len(out); i++ {
				if out[i].TS < out[i-1].TS {
					t.Errorf("event %d (%s) at %v, before the one ahead of it at %v", i, out[i].Type, out[i].TS, out[i-1].TS)
				}
			}
		})
	}
}

// TestConvertShapes: each event as the clients parse it — ts in Unix
// seconds, data present for an empty line, the exit's code and duration,
// the timeout's seconds.
func TestConvertShapes(t *testing.T) {
	t0 := time.Unix(1700000000, 500_000_000)
	out := convert([]runbox.Event{
		{TS: t0, Type: runbox.EventStarted},
		{TS: t0, Type: runbox.EventStdout, Data: "\n"},
		{TS: t0, Type: runbox.EventTimeout},
		{TS: t0, Type: runbox.EventDone, Result: &runbox.Result{}},
	}, 7)
	b, _ := json.Marshal(out)
	want := `[{"type":"ready","ts":1700000000.5},{"type":"stdout","ts":1700000000.5,"data":""},{"type":"timeout","ts":1700000000.5,"timeout_seconds":7}]`
	if string(b) != want {
		t.Fatalf("got  %s\nwant %s", b, want)
	}
	b, _ = json.Marshal(convert([]runbox.Event{{TS: t0, Type: runbox.EventExit, ExitCode: intp(0), DurationMS: int64p(12)}}, 7))
	if want := `[{"type":"exit","ts":1700000000.5,"code":0,"duration_ms":12}]`; string(b) != want {
		t.Fatalf("got  %s\nwant %s", b, want)
	}
}

// TestConvertBounded: a program that prints many short lines is listed
// up to maxLineEvents, then marked.
func TestConvertBounded(t *testing.T) {
	chunk := strings.Repeat("x\n", 1000)
	var evs []runbox.Event
	for range 15 {
		evs = append(evs, runbox.Event{TS: time.Now(), Type: runbox.EventStdout, Data: chunk})
	}
	evs = append(evs, runbox.Event{TS: time.Now(), Type: runbox.EventExit, ExitCode: intp(0), DurationMS: int64p(1)})
	out := convert(evs, 60)
	if len(out) != maxLineEvents+2 || out[maxLineEvents].Type != eventTruncated || out[len(out)-1].Type != runbox.EventExit {
		t.Fatalf("%d events, [%d] %+v, last %+v", len(out), maxLineEvents, out[maxLineEvents], out[len(out)-1])
	}
}

// FuzzConvert: whatever a program prints, every line event holds one
// line, and the lines rejoin into what it printed.
func FuzzConvert(f *testing.F) {
	f.Add("a\nb", "c\n", "")
	f.Add("", "\n\n", "x")
	f.Fuzz(func(t *testing.T, a, b, c string) {
		var evs []runbox.Event
		for _, d := range []string{a, b, c} {
			evs = append(evs, runbox.Event{TS: time.Now(), Type: runbox.EventStdout, Data: d})
		}
		evs = append(evs, runbox.Event{TS: time.Now(), Type: runbox.EventExit, ExitCode: intp(0), DurationMS: int64p(0)})
		out := convert(evs, 1)
		var lines []string
		for _, e := range out {
			if e.Type != runbox.EventStdout {
				continue
			}
			if strings.Contains(*e.Data, "\n") {
				t.Fatalf("a line event holds a newline: %q", *e.Data)
			}
			lines = append(lines, *e.Data)
		}
		all := a + b + c
		want := strings.TrimSuffix(all, "\n")
		if all == "" {
			want = ""
		}
		if got := strings.Join(lines, "\n"); got != want && len(lines) < maxLineEvents {
			t.Fatalf("rejoined %q, printed %q", got, all)
		}
	})
}
