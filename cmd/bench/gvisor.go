package main

import (
	"context"
	"log"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/runbox-dev/runbox/internal/bench"
)

// onlyGvisor measures the gVisor rows beside their runc baselines, taken
// first in the same run on a service of the engine's default runtime.
func onlyGvisor(ctx context.Context, binDir string, n int) ([]row, error) {
	var runc runcFigures
	csv := benchCSV()
	_, err := onService(ctx, binDir, func(svc *service, cs *mcp.ClientSession) ([]row, error) {
		svc.settle()
		lat, _, err := bench.Sequential(ctx, cs, "bench-warm", "python", "print(1)", 5, n)
		if err != nil {
			return nil, err
		}
		runc.warm = bench.Summarize(lat)
		if lat, err = bench.Paced(ctx, cs, "bench-paced", "python", "print(1)", pacedPause, 5, n); err != nil {
			return nil, err
		}
		runc.paced = bench.Summarize(lat)
		if runc.fresh, err = newConversations(ctx, cs, max(n/5, 10)); err != nil {
			return nil, err
		}
		if err := bench.Upload(ctx, cs, "bench-analysis", "bench.csv", csv); err != nil {
			return nil, err
		}
		lat, _, err = bench.Sequential(ctx, cs, "bench-analysis", "python", analysis, 3, max(n/4, 10))
		runc.snippet = bench.Summarize(lat)
		return nil, err
	})
	if err != nil {
		return nil, err
	}
	return gvisorRows(ctx, binDir, n, runc, csv)
}

// pacedPause is the pause between runs of the paced measure: a client
// that reads each result before its next call (a model takes seconds).
const pacedPause = 50 * time.Millisecond

// runcFigures are the rows gVisor's are set beside, measured under the
// engine's default runtime in the same bench run.
type runcFigures struct {
	warm, paced, fresh, snippet bench.Stats
}

// gvisorRows measures the warm (back to back and paced), new-conversation
// and analysis rows again with sandboxes under gVisor
// (SANDBOX_RUNTIME=runsc), beside runc's.
func gvisorRows(ctx context.Context, binDir string, n int, runc runcFigures, csv []byte) ([]row, error) {
	log.Print("gVisor: sandboxes under runsc")
	svc, cs, err := startSession(ctx, binDir, serviceOptions{executors: 1, runtime: "runsc"})
	if err != nil {
		return nil, err
	}
	defer svc.stop()
	defer cs.Close()
	svc.settle()
	lat, _, err := bench.Sequential(ctx, cs, "bench-gvisor", "python", "print(1)", 5, n)
	if err != nil {
		return nil, err
	}
	w := bench.Summarize(lat)
	lat, err = bench.Paced(ctx, cs, "bench-gvisor-paced", "python", "print(1)", pacedPause, 5, n)
	if err != nil {
		return nil, err
	}
	p := bench.Summarize(lat)
	f, err := newConversations(ctx, cs, max(n/5, 10))
	if err != nil {
		return nil, err
	}
	if err := bench.Upload(ctx, cs, "bench-gvisor-analysis", "bench.csv", csv); err != nil {
		return nil, err
	}
	lat, _, err = bench.Sequential(ctx, cs, "bench-gvisor-analysis", "python", analysis, 3, max(n/4, 10))
	if err != nil {
		return nil, err
	}
	a := bench.Summarize(lat)
	return []row{{
		measure:  "gVisor (`SANDBOX_RUNTIME=runsc`): `run_code` `print(1)` over `/mcp`, sequential, warm",
		result:   pair(w),
		baseline: "runc " + ms(runc.warm.Median),
		ratio:    ratio(w.Median, runc.warm.Median),
		target:   "≤ 2× runc",
		met:      w.Median <= 2*runc.warm.Median,
	}, {
		measure:  "gVisor: `run_code` `print(1)` over `/mcp`, warm, paced (50 ms after each result, as a client that reads it)",
		result:   pair(p),
		baseline: "runc " + ms(runc.paced.Median),
		ratio:    ratio(p.Median, runc.paced.Median),
		target:   "—",
		met:      true,
	}, {
		measure:  "gVisor: `run_code` `print(1)` over `/mcp`, a new conversation each time (pre-started sandboxes)",
		result:   pair(f),
		baseline: "runc " + ms(runc.fresh.Median),
		ratio:    ratio(f.Median, runc.fresh.Median),
		target:   "—",
		met:      true,
	}, {
		measure:  "gVisor: analysis snippet over `/mcp`",
		result:   pair(a),
		baseline: "runc " + ms(runc.snippet.Median),
		ratio:    ratio(a.Median, runc.snippet.Median),
		target:   "—",
		met:      true,
	}}, nil
}
