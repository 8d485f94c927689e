package sandbox

import (
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
)

// TestDemand: the pool follows the new conversations of the last window,
// less the sandboxes recycled into it, within the configured floor and
// the ceiling, and shrinks back after.
func TestDemand(t *testing.T) {
	clock := clockwork.NewFakeClock()
	d := newDemand(clock)
	steps := []struct {
		name        string
		takes, back int
		advance     time.Duration
		configured  int
		want        int
	}{
		{"quiet: the configured count", 0, 0, 0, 2, 2},
		{"a burst of 5", 5, 0, time.Second, 2, 5},
		{"capped at the ceiling", 20, 0, time.Second, 2, 8},
		{"still within the window", 0, 0, 5 * time.Second, 2, 8},
		{"after the window", 0, 0, demandWindow, 2, 2},
		{"each take recycled back: the configured count", 10, 10, time.Second, 2, 2},
		{"takes outrun the recycling", 6, 1, time.Second, 2, 5},
		{"no pool configured: none", 3, 0, 0, 0, 0},
	}
	for _, s := range steps {
		for range s.takes {
			d.took("python")
		}
		for range s.back {
			d.returned("python")
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
