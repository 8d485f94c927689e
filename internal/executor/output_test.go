package executor

import (
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/runbox-dev/runbox"
	"github.com/runbox-dev/runbox/internal/sandbox"
)

func TestOutputCapsAndSplitsOnCharacters(t *testing.T) {
	euro := "€" // three bytes
	tests := []struct {
		name      string
		max       int
		chunks    []string
		want      string
		truncated bool
	}{
		{"fits", 100, []string{"hello ", "world\n"}, "hello world\n", false},
		{"character split across chunks", 100, []string{"a" + euro[:1], euro[1:2], euro[2:] + "b"}, "a" + euro + "b", false},
		{"cut at the cap", 5, []string{"abc", "defgh"}, "abcde", true},
		{"nothing after the cap", 3, []string{"abc", "def", "ghi"}, "abc", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var events []runbox.Event
			o := newOutput(tt.max, func(evs ...runbox.Event) { events = append(events, evs...) })
			for _, c := range tt.chunks {
				o.write(sandbox.Stdout, []byte(c))
			}
			events = append(events, o.rest()...)
			var published strings.Builder
			for _, ev := range events {
				if ev.Type != runbox.EventStdout {
					t.Errorf("event type %s", ev.Type)
				}
				if !tt.truncated && !utf8.ValidString(ev.Data) {
					t.Errorf("event %q splits a character", ev.Data)
				}
				published.WriteString(ev.Data)
			}
			got, truncated := o.stdout.text()
			if got != tt.want || truncated != tt.truncated || published.String() != tt.want {
				t.Errorf("kept %q (truncated %v), published %q; want %q (%v)", got, truncated, published.String(), tt.want, tt.truncated)
			}
			if o.stderr.total != 0 {
				t.Error("stderr counted stdout")
			}
		})
	}
}

func TestOutputCountsBeyondTheCap(t *testing.T) {
	o := newOutput(10, func(...runbox.Event) {})
	for range 1000 {
		o.write(sandbox.Stderr, []byte("0123456789"))
	}
	if o.stderr.total != 10000 || len(o.stderr.kept) != 10 || !o.stderr.truncated {
		t.Errorf("total %d kept %d truncated %v", o.stderr.total, len(o.stderr.kept), o.stderr.truncated)
	}
}

func TestOutputEventsBounded(t *testing.T) {
	var events []runbox.Event
	o := newOutput(1<<20, func(evs ...runbox.Event) { events = append(events, evs...) })
	// A byte at a time, on both streams: more writes than events allowed.
	var want [2]strings.Builder
	for i := range 3 * maxOutputEvents {
		s, b := sandbox.Stdout, byte('a'+i%26)
		if i%3 == 0 {
			s = sandbox.Stderr
		}
		o.write(s, []byte{b})
		want[s-1].WriteByte(b)
	}
	events = append(events, o.rest()...)
	if len(events) > maxOutputEvents+2 {
		t.Errorf("%d events for %d writes, want at most %d", len(events), 3*maxOutputEvents, maxOutputEvents+2)
	}
	var got [2]strings.Builder
	for _, ev := range events {
		if ev.Type == runbox.EventStdout {
			got[0].WriteString(ev.Data)
		} else {
			got[1].WriteString(ev.Data)
		}
	}
	for i := range got {
		if got[i].String() != want[i].String() {
			t.Errorf("stream %d: published %d bytes, wrote %d", i+1, got[i].Len(), want[i].Len())
		}
	}
}
