package main

import (
	"context"
	"fmt"
	"log"
	"time"

	"github.com/runbox-dev/runbox/internal/bench"
)

// scaleOut measures a deployment past one machine: two executors with
// folders of their own, sharing Redis and an S3 store (versitygw).
func scaleOut(ctx context.Context, binDir string, n int, hostWarm bench.Stats) ([]row, error) {
	log.Print("two executors, files in S3 (versitygw)")
	svc, cs, err := startSession(ctx, binDir, serviceOptions{executors: 2, s3: true})
	if err != nil {
		return nil, err
	}
	defer svc.stop()
	defer cs.Close()
	lat, _, err := bench.Sequential(ctx, cs, "bench-s3", "python", "print(1)", 5, n)
	if err != nil {
		return nil, err
	}
	l := bench.Summarize(lat)
	log.Print("affinity: 4 conversations, 25 sequential runs each, two executors")
	aff, err := bench.Affinity(ctx, cs, "bench-affinity", 4, 25)
	if err != nil {
		return nil, err
	}
	share := float64(aff.Hits) / float64(aff.Runs)
	return []row{{
		measure:  "`run_code` `print(1)` over `/mcp`, sequential, warm, files in S3, two executors",
		result:   pair(l),
		baseline: "host folder " + ms(hostWarm.Median),
		ratio:    ratio(l.Median, hostWarm.Median),
		target:   "≤ 40 ms",
		met:      l.Median <= 40*time.Millisecond,
	}, {
		measure:  "affinity: sequential runs of a conversation in its previous run's sandbox, two executors (4 × 25 runs)",
		result:   fmt.Sprintf("%.0f %% (%d of %d); at most %d sandbox(es) per conversation", 100*share, aff.Hits, aff.Runs, aff.MaxSandboxes),
		baseline: "any executor: 50 %",
		ratio:    fmt.Sprintf("%.2f×", share/0.5),
		target:   "≥ 95 %, one sandbox each",
		met:      share >= 0.95 && aff.MaxSandboxes == 1,
	}}, nil
}
