package executor

import (
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
)

// TestDemand: the pool follows the new conversations of the last window,
// within the configured floor and the ceiling, and shrinks back after.
func TestDemand(t *testing.T) {
	clock := clockwork.NewFakeClock()
	d := newDemand(clock)
	steps := []struct {
		name       string
		takes      int
		advance    time.Duration
		configured int
		want       int
	}{
		{"quiet: the configured count", 0, 0, 2, 2},
		{"a burst of 5", 5, time.Second, 2, 5},
		{"capped at the ceiling", 20, time.Second, 2, 8},
		{"still within the window", 0, 5 * time.Second, 2, 8},
		{"after the window", 0, demandWindow, 2, 2},
		{"no pool configured: none", 3, 0, 0, 0},
	}
	for _, s := range steps {
		for range s.takes {
			d.took("python")
		}
		clock.Advance(s.advance)
		if got := d.target("python", s.configured, 8); got != s.want {
			t.Errorf("%s: target %d, want %d", s.name, got, s.want)
		}
	}
	if got := d.target("bash", 1, 8); got != 1 {
		t.Errorf("another language: %d", got)
	}
}
