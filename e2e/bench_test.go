package e2e

import (
	"context"
	"testing"
	"time"

	"github.com/runbox-dev/runbox/internal/bench"
)

// BenchmarkEngines measures run_code's print(1) through the whole service
// (MCP, queue, executor, engine, agent) with the sandboxes on each
// engine, one after the other in the same run, so that each figure has
// its baseline beside it: in a conversation that ran already, and in a
// new conversation each time, at two paces. make bench runs
// it after building the test cluster; each sub-benchmark reports its
// median and 90th percentile.
func BenchmarkEngines(b *testing.B) {
	for _, engine := range []string{"docker", "kubernetes"} {
		b.Run(engine, func(b *testing.B) {
			// Idle sandboxes a few: the test cluster's one node has room for
			// about twenty pods (each asks a tenth of a core), and every
			// new conversation keeps its own.
			s := start(b, options{engine: engine, env: []string{"SANDBOX_MAX_WARM=4"}})
			cs := s.session(nil)
			ctx := context.Background()
			printOne := func(b *testing.B, cid string) time.Duration {
				args := map[string]any{"language": "python", "code": "print(1)"}
				if cid != "" {
					args["conversationId"] = cid
				}
				t0 := time.Now()
				r, err := bench.RunCode(ctx, cs, args, nil)
				took := time.Since(t0)
				if err != nil || !r.Success || r.Stdout != "1\n" {
					b.Fatalf("run_code print(1): %+v %v", r, err)
				}
				return took
			}
			b.Run("warm", func(b *testing.B) {
				cid := "bench-warm-" + engine
				printOne(b, cid)
				var took []time.Duration
				for b.Loop() {
					took = append(took, printOne(b, cid))
				}
				report(b, took)
			})
			// New conversations 3 s apart find a pooled sandbox started for
			// them; 0.3 s apart (cmd/bench's pace) they come faster than
			// pods start (~2 s, two at once), and wait for one.
			for _, pace := range []struct {
				name string
				gap  time.Duration
			}{{"new-conversation-3s-apart", 3 * time.Second}, {"new-conversation-0.3s-apart", 300 * time.Millisecond}} {
				b.Run(pace.name, func(b *testing.B) {
					var took []time.Duration
					for b.Loop() {
						b.StopTimer()
						time.Sleep(pace.gap)
						b.StartTimer()
						took = append(took, printOne(b, ""))
					}
					report(b, took)
				})
			}
		})
	}
}

// report gives a sub-benchmark's median and 90th percentile, in ms.
func report(b *testing.B, took []time.Duration) {
	st := bench.Summarize(took)
	b.ReportMetric(float64(st.Median.Microseconds())/1000, "p50-ms")
	b.ReportMetric(float64(st.P90.Microseconds())/1000, "p90-ms")
}
