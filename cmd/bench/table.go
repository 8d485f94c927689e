package main

import (
	"fmt"
	"os"
	"runtime"
	"strings"
	"time"

	"github.com/runbox-dev/runbox/internal/bench"
)

// row is a line of the table: a measure beside its baseline.
type row struct {
	measure, result, baseline, ratio, target string
	met                                      bool
}

// output prints the table and writes it to outFile, if named.
func output(rows []row, outFile string) error {
	table := render(rows)
	fmt.Print(table)
	if outFile != "" {
		return os.WriteFile(outFile, []byte(table), 0o644)
	}
	return nil
}

func render(rows []row) string {
	var b strings.Builder
	host, _ := os.Hostname()
	fmt.Fprintf(&b, "\nrunbox bench, %s, %s, %d CPUs\n\n", time.Now().UTC().Format("2006-01-02 15:04 MST"), host, runtime.NumCPU())
	b.WriteString("| measure | result: median (p90) | baseline, same run | ratio | target | met |\n|---|---|---|---|---|---|\n")
	for _, r := range rows {
		met := "yes"
		if !r.met {
			met = "**no**"
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %s |\n", r.measure, r.result, r.baseline, r.ratio, r.target, met)
	}
	return b.String()
}

// loadRow is the row of a load run beside `docker run --rm` four at once
// (baseRate runs/s); met also needs the run to have had no error.
func loadRow(measure string, r bench.LoadResult, baseRate float64, target string, met bool) row {
	return row{
		measure:  measure,
		result:   fmt.Sprintf("%.1f runs/s, %d errors (p50 %s, p90 %s)", r.Throughput(), r.Errors, ms(r.Latency.Median), ms(r.Latency.P90)),
		baseline: fmt.Sprintf("`docker run --rm`, 4 at once: %.1f runs/s", baseRate),
		ratio:    fmt.Sprintf("%.1f×", r.Throughput()/baseRate),
		target:   target,
		met:      met && r.Errors == 0,
	}
}

func pair(s bench.Stats) string { return fmt.Sprintf("%s (%s)", ms(s.Median), ms(s.P90)) }

func ms(d time.Duration) string {
	if d < 10*time.Millisecond {
		return fmt.Sprintf("%.2f ms", float64(d)/float64(time.Millisecond))
	}
	return fmt.Sprintf("%.0f ms", float64(d)/float64(time.Millisecond))
}

func ratio(a, b time.Duration) string { return fmt.Sprintf("%.3f×", float64(a)/float64(b)) }
