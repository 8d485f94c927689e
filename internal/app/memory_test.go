package app

import (
	"strings"
	"testing"
)

func TestMemAvailable(t *testing.T) {
	for _, c := range []struct {
		name, meminfo string
		want          int64
	}{
		{"linux", "MemTotal:       24684004 kB\nMemFree:        13551232 kB\nMemAvailable:   22872064 kB\n", 22872064 << 10},
		{"absent (old kernels)", "MemTotal:       24684004 kB\nMemFree:        13551232 kB\n", 0},
		{"garbled", "MemAvailable:   lots kB\n", 0},
		{"negative", "MemAvailable:   -5 kB\n", 0},
	} {
		if got := memAvailable(strings.NewReader(c.meminfo)); got != c.want {
			t.Errorf("%s: %d, want %d", c.name, got, c.want)
		}
	}
}
