package executor

import (
	"fmt"
	"testing"
)

// TestRecentRuns: the last recentMax ids are known, older ones forgotten.
func TestRecentRuns(t *testing.T) {
	var r recentRuns
	for i := range recentMax + 10 {
		r.add(fmt.Sprint("run-", i))
	}
	r.add("run-20") // known already: nothing changes
	for _, c := range []struct {
		id   string
		want bool
	}{{"run-0", false}, {"run-9", false}, {"run-10", true}, {"run-20", true}, {fmt.Sprint("run-", recentMax+9), true}, {"other", false}} {
		if got := r.has(c.id); got != c.want {
			t.Errorf("has(%s) = %v, want %v", c.id, got, c.want)
		}
	}
	if len(r.ids) != recentMax {
		t.Errorf("%d ids kept", len(r.ids))
	}
}

// TestStartsWanted: the pool starts what its target lacks beside those
// waiting and starting, within the starts allowed at once, and none while
// sandboxes come by recycling.
func TestStartsWanted(t *testing.T) {
	for _, c := range []struct {
		name                                             string
		target, pooled, coming, starting, allStarting, n int
	}{
		{"full", 2, 2, 0, 0, 0, 0},
		{"one taken", 2, 1, 0, 0, 0, 1},
		{"one taken, one starting", 2, 1, 0, 1, 1, 0},
		{"a burst: as many as allowed at once", 16, 0, 0, 0, 0, poolStarts},
		{"other languages starting use the allowance", 16, 0, 0, 0, poolStarts - 1, 1},
		{"the allowance used up", 16, 0, 0, 1, poolStarts, 0},
		{"more than the target: none", 2, 5, 0, 0, 0, 0},
		{"a burst refilled by recycling: no start", 16, 0, 1, 0, 0, 0},
	} {
		if got := startsWanted(c.target, c.pooled, c.coming, c.starting, c.allStarting); got != c.n {
			t.Errorf("%s: %d starts, want %d", c.name, got, c.n)
		}
	}
}
