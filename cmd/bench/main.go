// Command bench starts runbox (redis-server, an executor and api, with the
// binaries in -bin), measures it from the outside as issue #5 defines, each
// figure beside a baseline measured in the same run with Docker alone, and
// prints a table. `make bench` runs it.
package main

import (
	"context"
	"flag"
	"fmt"
	"log"
	"strings"
	"time"

	"github.com/runbox-dev/runbox/internal/bench"
)

const image = "runner-python"

func main() {
	binDir := flag.String("bin", "bin", "folder holding the api and executor binaries")
	out := flag.String("out", "", "also write the table (markdown) to this file")
	samples := flag.Int("n", 50, "samples of the sequential print(1) measure (others scale from it)")
	only := flag.String("only", "", "measure only these, comma-separated: streams, egress, previews, languages, commands, gvisor, batches, roundtrips, cold, burst, forks, pause, fair, e2b")
	batchRuns := flag.Int("batch-runs", 2000, "runs of the batches' row (and of its one-by-one baseline)")
	flag.Parse()
	log.SetFlags(0)
	if *only != "" {
		if err := runOnly(*binDir, *only, *out, *samples, *batchRuns); err != nil {
			log.Fatal("bench: ", err)
		}
		return
	}
	if err := run(*binDir, *out, *samples, *batchRuns); err != nil {
		log.Fatal("bench: ", err)
	}
}

// runOnly measures the groups named in only (comma-separated).
func runOnly(binDir, only, outFile string, n, batchRuns int) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	rows := []row{machineRow()}
	for name := range strings.SplitSeq(only, ",") {
		measure := onlyMeasure(strings.TrimSpace(name), n, batchRuns)
		if measure == nil {
			return fmt.Errorf("-only: unknown measure %q", name)
		}
		r, err := measure(ctx, binDir)
		if err != nil {
			return err
		}
		rows = append(rows, r...)
	}
	return output(rows, outFile)
}

// onlyMeasure returns the group of rows -only calls name, nil if there is
// none: measured with binDir's binaries, n samples (batchRuns runs for the
// batches).
func onlyMeasure(name string, n, batchRuns int) func(ctx context.Context, binDir string) ([]row, error) {
	switch name {
	case "streams":
		return func(ctx context.Context, _ string) ([]row, error) {
			r, err := dialPortRow(ctx, 4*n)
			return []row{r}, err
		}
	case "egress":
		return func(ctx context.Context, binDir string) ([]row, error) { return egressRows(ctx, binDir, n, nil) }
	case "batches":
		n = batchRuns
	}
	measure, ok := map[string]func(context.Context, string, int) ([]row, error){
		"languages": onlyLanguages, "cold": onlyCold, "burst": onlyBurst, "roundtrips": onlyRoundTrips,
		"commands": onlyCommands, "gvisor": onlyGvisor, "previews": onlyPreviews, "forks": onlyForks,
		"pause": onlyPause, "batches": onlyBatches, "fair": onlyFair, "e2b": onlyE2B,
	}[name]
	if !ok {
		return nil
	}
	return func(ctx context.Context, binDir string) ([]row, error) { return measure(ctx, binDir, n) }
}

func run(binDir, outFile string, n, batchRuns int) error {
	ctx, cancel := context.WithTimeout(context.Background(), 45*time.Minute)
	defer cancel()
	machine := machineRow() // before the service's processes start
	svc, err := startService(binDir, serviceOptions{executors: 1})
	if err != nil {
		return err
	}
	defer svc.stop()
	client := bench.Client{URL: svc.url, Token: svc.token}
	cs, err := client.Session(ctx, nil)
	if err != nil {
		return err
	}
	defer cs.Close()
	langs, err := languageRows(ctx, cs, max(n/4, 12))
	if err != nil {
		return err
	}
	s := &suite{svc: svc, client: client, cs: cs, n: n}
	rows := []row{machine}
	for _, measure := range []func(context.Context) ([]row, error){
		s.warm,
		s.roundTrips,
		func(ctx context.Context) ([]row, error) { return commandRows(ctx, cs, n) },
		s.keptState,
		s.fork,
		s.pauseResume,
		s.newConversation,
		s.burst,
		s.analysis,
		s.throughput,
		func(ctx context.Context) ([]row, error) { return batchRows(ctx, svc, batchRuns) },
		s.enqueue,
		s.firstOutput,
		s.resources,
		func(ctx context.Context) ([]row, error) { return previewRows(ctx, svc, cs, n) },
	} {
		r, err := measure(ctx)
		if err != nil {
			return err
		}
		rows = append(rows, r...)
	}

	svc.stop()
	e2b, err := onlyE2B(ctx, binDir, n)
	if err != nil {
		return err
	}
	rows = append(rows, e2b...)
	dial, err := dialPortRow(ctx, 4*n)
	if err != nil {
		return err
	}
	rows = append(rows, dial)
	warm := s.runc.warm
	egress, err := egressRows(ctx, binDir, n, &warm)
	if err != nil {
		return err
	}
	rows = append(rows, egress...)
	fair, err := fairRows(ctx, binDir, n)
	if err != nil {
		return err
	}
	rows = append(rows, fair...)
	scaled, err := scaleOut(ctx, binDir, n, warm)
	if err != nil {
		return err
	}
	rows = append(rows, scaled...)
	gv, err := gvisorRows(ctx, binDir, n, s.runc, s.csv)
	if err != nil {
		return err
	}
	rows = append(rows, gv...)
	return output(append(rows, langs...), outFile)
}
