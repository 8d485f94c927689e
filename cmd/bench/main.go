// Command bench starts runbox (redis-server, an executor and api, with the
// binaries in -bin), measures it from the outside as issue #5 defines, each
// figure beside a baseline measured in the same run with Docker alone, and
// prints a table. `make bench` runs it.
package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"flag"
	"fmt"
	"log"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
	"github.com/runbox-dev/runbox/examples/marketing/demo"

	"github.com/runbox-dev/runbox/internal/bench"
)

const image = "runner-python"

// analysis is the measured data-analysis snippet.
const analysis = `import pandas as pd, matplotlib.pyplot as plt
df = pd.read_csv('bench.csv')
df.groupby('channel')['revenue'].sum().plot(kind='bar')
plt.savefig('bench.png')
print(len(df))
`

func main() {
	binDir := flag.String("bin", "bin", "folder holding the api and executor binaries")
	out := flag.String("out", "", "also write the table (markdown) to this file")
	samples := flag.Int("n", 50, "samples of the sequential print(1) measure (others scale from it)")
	only := flag.String("only", "", "measure only these, comma-separated: streams, egress, previews, languages, commands, gvisor")
	flag.Parse()
	log.SetFlags(0)
	if *only != "" {
		if err := runOnly(*binDir, *only, *out, *samples); err != nil {
			log.Fatal("bench: ", err)
		}
		return
	}
	if err := run(*binDir, *out, *samples); err != nil {
		log.Fatal("bench: ", err)
	}
}

type row struct {
	measure, result, baseline, ratio, target string
	met                                      bool
}

func run(binDir, outFile string, n int) error {
	ctx, cancel := context.WithTimeout(context.Background(), 45*time.Minute)
	defer cancel()
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
	var rows []row

	log.Printf("baseline: docker run --rm %s python3 -c 'print(1)'", image)
	dockerRun, _, err := bench.DockerRun(ctx, image, max(n/5, 10), 1, "python3", "-c", "print(1)")
	if err != nil {
		return err
	}
	dr := bench.Summarize(dockerRun)

	log.Print("run_code print(1) over /mcp, sequential, warm")
	lat, queue, err := bench.Sequential(ctx, cs, "bench-seq", "python", "print(1)", 5, n)
	if err != nil {
		return err
	}
	l := bench.Summarize(lat)
	warm := l
	log.Print("run_code print(1) over /mcp, paced")
	paced, err := bench.Paced(ctx, cs, "bench-paced", "python", "print(1)", pacedPause, 5, n)
	if err != nil {
		return err
	}
	rows = append(rows, row{
		measure:  "`run_code` `print(1)` over `/mcp`, sequential, warm",
		result:   pair(l),
		baseline: "`docker run --rm` " + ms(dr.Median),
		ratio:    ratio(l.Median, dr.Median),
		target:   "≤ 60 ms; ≤ 0.15×",
		met:      l.Median <= 60*time.Millisecond && float64(l.Median) <= 0.15*float64(dr.Median),
	})

	cmdRows, err := commandRows(ctx, cs, n)
	if err != nil {
		return err
	}
	rows = append(rows, cmdRows...)

	log.Print("run_code keep_state 1+1 over /mcp, sequential")
	klat, _, err := bench.SequentialArgs(ctx, cs, map[string]any{"language": "python", "code": "1 + 1",
		"conversationId": "bench-kept", "keep_state": true}, 5, n)
	if err != nil {
		return err
	}
	kl := bench.Summarize(klat)
	rows = append(rows, row{
		measure:  "`run_code` `keep_state` cell `1 + 1` over `/mcp`, sequential",
		result:   pair(kl),
		baseline: "fresh process " + ms(l.Median),
		ratio:    ratio(kl.Median, l.Median),
		target:   "≤ 25 ms",
		met:      kl.Median <= 25*time.Millisecond,
	})

	log.Print("run_code print(1), each in a new conversation")
	fr, err := newConversations(ctx, cs, max(n/5, 10))
	if err != nil {
		return err
	}
	runcFresh := fr
	rows = append(rows, row{
		measure:  "`run_code` `print(1)` over `/mcp`, a new conversation each time (pre-started sandboxes)",
		result:   pair(fr),
		baseline: "`docker run --rm` " + ms(dr.Median),
		ratio:    ratio(fr.Median, dr.Median),
		target:   "—",
		met:      true,
	})

	log.Print("analysis snippet: baseline docker exec, then over /mcp")
	csv := benchCSV()
	dir, err := os.MkdirTemp("", "runbox-bench-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	os.Chmod(dir, 0o777)
	os.WriteFile(filepath.Join(dir, "bench.csv"), csv, 0o644)
	os.WriteFile(filepath.Join(dir, "snippet.py"), []byte(analysis), 0o644)
	ctr, err := bench.StartContainer(ctx, image, dir)
	if err != nil {
		return err
	}
	var execTimes, firstLines []time.Duration
	for i := range 11 {
		d, err := ctr.Exec(ctx, "python3", "snippet.py")
		if err != nil {
			ctr.Remove()
			return err
		}
		if i > 0 { // the first builds matplotlib's font cache
			execTimes = append(execTimes, d)
		}
	}
	for range 10 {
		d, err := ctr.FirstLine(ctx)
		if err != nil {
			ctr.Remove()
			return err
		}
		firstLines = append(firstLines, d)
	}
	ctr.Remove()
	ex := bench.Summarize(execTimes)
	if err := bench.Upload(ctx, cs, "bench-analysis", "bench.csv", csv); err != nil {
		return err
	}
	lat, _, err = bench.Sequential(ctx, cs, "bench-analysis", "python", analysis, 3, max(n/4, 10))
	if err != nil {
		return err
	}
	l = bench.Summarize(lat)
	runcAnalysis := l
	rows = append(rows, row{
		measure:  fmt.Sprintf("analysis snippet (pandas + matplotlib, %d KB CSV, plot, PNG) over `/mcp`", len(csv)>>10),
		result:   pair(l),
		baseline: "`docker exec python3` " + ms(ex.Median),
		ratio:    ratio(l.Median, ex.Median),
		target:   "≤ 0.3×",
		met:      float64(l.Median) <= 0.3*float64(ex.Median),
	})

	log.Print("throughput: 400 print(1) runs, 16 conversations, 16 clients")
	_, drWall, err := bench.DockerRun(ctx, image, 20, 4, "python3", "-c", "print(1)")
	if err != nil {
		return err
	}
	baseRate := 20 / drWall.Seconds()
	rss := svc.sampleRSS()
	load, err := bench.Load(ctx, client, bench.LoadConfig{Runs: 400, Conversations: 16, Clients: 16, Language: "python",
		Code: "print(1)", Prefix: "bench-load"})
	peak := rss()
	if err != nil {
		return err
	}
	rows = append(rows, loadRow("throughput: 400 `print(1)` runs, 16 conversations, 16 concurrent clients (cold starts included)",
		load, baseRate, "≥ 40 runs/s, 0 errors", load.Throughput() >= 40))

	log.Print("600 runs over 60 conversations, 16 clients")
	many, err := bench.Load(ctx, client, bench.LoadConfig{Runs: 600, Conversations: 60, Clients: 16, Language: "python",
		Code: "print(1)", Prefix: "bench-many"})
	if err != nil {
		return err
	}
	rows = append(rows, loadRow("600 `print(1)` runs over 60 conversations (more than `SANDBOX_MAX_WARM`), 16 concurrent clients",
		many, baseRate, "≥ 40 runs/s, 0 errors", many.Throughput() >= 40))
	log.Print("200 runs, each in a new conversation, 16 clients")
	fresh16, err := bench.Load(ctx, client, bench.LoadConfig{Runs: 200, Clients: 16, Language: "python",
		Code: "print(1)", NewEach: true})
	if err != nil {
		return err
	}
	rows = append(rows, loadRow("200 `print(1)` runs, each in a new conversation, 16 concurrent clients",
		fresh16, baseRate, "≥ 30 runs/s and ≥ 4×; p50 ≤ 60 ms",
		fresh16.Throughput() >= 30 && fresh16.Throughput() >= 4*baseRate && fresh16.Latency.Median <= 60*time.Millisecond))

	log.Print("enqueue → started")
	apiStart, err := bench.APIStart(ctx, image, 10)
	if err != nil {
		return err
	}
	q, as := bench.Summarize(queue), bench.Summarize(apiStart)
	rows = append(rows, row{
		measure:  "enqueue → `started` (run events' timestamps)",
		result:   pair(q),
		baseline: "container create + start " + ms(as.Median),
		ratio:    ratio(q.Median, as.Median),
		target:   "≤ 5 ms p50",
		met:      q.Median <= 5*time.Millisecond,
	})

	log.Print("first output line → client")
	first, err := bench.FirstOutput(ctx, client, "bench-first", max(n/2, 10))
	if err != nil {
		return err
	}
	f, fl := bench.Summarize(first), bench.Summarize(firstLines)
	rows = append(rows, row{
		measure:  "first output line → client (progress notification)",
		result:   pair(f),
		baseline: "`docker exec` stream " + ms(fl.Median),
		ratio:    ratio(f.Median, fl.Median),
		target:   "≤ 50 ms",
		met:      f.Median <= 50*time.Millisecond,
	})
	const limit = 64 << 20
	rows = append(rows, row{
		measure:  "resident memory during the throughput run",
		result:   fmt.Sprintf("api %.1f MiB, executor %.1f MiB", float64(peak["api"])/(1<<20), float64(peak["executor-0"])/(1<<20)),
		baseline: "limit 64 MiB",
		ratio:    fmt.Sprintf("%.2f×", float64(max(peak["api"], peak["executor-0"]))/limit),
		target:   "≤ 64 MiB each",
		met:      peak["api"] <= limit && peak["executor-0"] <= limit,
	})

	log.Print("idle: api + executor + redis-server, 20 s")
	time.Sleep(5 * time.Second) // the pool refills, sandboxes settle
	idle := svc.cpu(20 * time.Second)
	rows = append(rows, row{
		measure:  "idle CPU: api + executor + redis-server together, 20 s",
		result:   fmt.Sprintf("%.1f %% of one core", 100*idle),
		baseline: "nothing running: 0 %",
		ratio:    "—",
		target:   "< 3 %",
		met:      idle < 0.03,
	})

	pv, err := previewRows(ctx, svc, cs, n)
	if err != nil {
		return err
	}
	rows = append(rows, pv...)

	svc.stop()
	dial, err := dialPortRow(ctx, 4*n)
	if err != nil {
		return err
	}
	rows = append(rows, dial)
	egress, err := egressRows(ctx, binDir, n, &warm)
	if err != nil {
		return err
	}
	rows = append(rows, egress...)
	scaled, err := scaleOut(ctx, binDir, n, warm)
	if err != nil {
		return err
	}
	rows = append(rows, scaled...)
	gv, err := gvisorRows(ctx, binDir, n, runcFigures{warm: warm, paced: bench.Summarize(paced), fresh: runcFresh, snippet: runcAnalysis}, csv)
	if err != nil {
		return err
	}
	rows = append(rows, gv...)
	return output(append(rows, langs...), outFile)
}

// runOnly measures the groups named in only (comma-separated).
func runOnly(binDir, only, outFile string, n int) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	var rows []row
	for name := range strings.SplitSeq(only, ",") {
		switch strings.TrimSpace(name) {
		case "streams":
			r, err := dialPortRow(ctx, 4*n)
			if err != nil {
				return err
			}
			rows = append(rows, r)
		case "egress":
			r, err := egressRows(ctx, binDir, n, nil)
			if err != nil {
				return err
			}
			rows = append(rows, r...)
		case "languages":
			r, err := onlyLanguages(ctx, binDir, n)
			if err != nil {
				return err
			}
			rows = append(rows, r...)
		case "commands":
			r, err := onlyCommands(ctx, binDir, n)
			if err != nil {
				return err
			}
			rows = append(rows, r...)
		case "gvisor":
			r, err := onlyGvisor(ctx, binDir, n)
			if err != nil {
				return err
			}
			rows = append(rows, r...)
		case "previews":
			r, err := onlyPreviews(ctx, binDir, n)
			if err != nil {
				return err
			}
			rows = append(rows, r...)
		default:
			return fmt.Errorf("-only: unknown measure %q", name)
		}
	}
	return output(rows, outFile)
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

// benchCSV is about 1 MB of campaign data.
func benchCSV() []byte {
	var b bytes.Buffer
	for seed := uint64(1); b.Len() < 1<<20; seed++ {
		var one bytes.Buffer
		demo.GenerateCSV(&one, seed)
		data := one.Bytes()
		if b.Len() > 0 {
			data = data[bytes.IndexByte(data, '\n')+1:] // one header
		}
		b.Write(data)
	}
	return b.Bytes()
}

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

// startSession starts a service and connects an MCP client to it.
func startSession(ctx context.Context, binDir string, o serviceOptions) (*service, *mcp.ClientSession, error) {
	svc, err := startService(binDir, o)
	if err != nil {
		return nil, nil, err
	}
	cs, err := bench.Client{URL: svc.url, Token: svc.token}.Session(ctx, nil)
	if err != nil {
		svc.stop()
		return nil, nil, err
	}
	return svc, cs, nil
}

// newConversations times n runs of print(1), each in a new conversation.
func newConversations(ctx context.Context, cs *mcp.ClientSession, n int) (bench.Stats, error) {
	var lat []time.Duration
	for range n {
		time.Sleep(300 * time.Millisecond) // the pool refills between calls, as between an agent's
		t := time.Now()
		if _, err := bench.RunCode(ctx, cs, map[string]any{"language": "python", "code": "print(1)"}, nil); err != nil {
			return bench.Stats{}, err
		}
		lat = append(lat, time.Since(t))
	}
	return bench.Summarize(lat), nil
}

// service is the runbox under test.
type service struct {
	url, token string
	root       string
	procs      map[string]*exec.Cmd
	logs       map[string]*bytes.Buffer
	stopped    bool
}

type serviceOptions struct {
	executors int
	// s3 keeps the files in an S3 server (versitygw) started here, each
	// executor with a SANDBOX_ROOT of its own.
	s3 bool
	// env is more settings for every process.
	env []string
	// runtime is SANDBOX_RUNTIME; "" the engine's default.
	runtime string
}

func startService(binDir string, o serviceOptions) (*service, error) {
	for _, b := range []string{"api", "executor"} {
		if _, err := os.Stat(filepath.Join(binDir, b)); err != nil {
			return nil, fmt.Errorf("%s/%s is missing: run make build", binDir, b)
		}
	}
	root, err := os.MkdirTemp("", "runbox-bench-root-")
	if err != nil {
		return nil, err
	}
	s := &service{token: "bench-" + rand.Text(), root: root, procs: map[string]*exec.Cmd{}, logs: map[string]*bytes.Buffer{}}
	redisPort, apiPort := freePort(), freePort()
	s.url = fmt.Sprintf("http://127.0.0.1:%d", apiPort)
	redis := exec.Command("redis-server", "--port", strconv.Itoa(redisPort), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no")
	if err := s.start("redis", redis); err != nil {
		return nil, fmt.Errorf("start redis-server (apt-get install redis-server): %w", err)
	}
	env := append(os.Environ(),
		fmt.Sprintf("REDIS_URL=redis://127.0.0.1:%d/0", redisPort),
		"MCP_HTTP_ADDR="+fmt.Sprintf("127.0.0.1:%d", apiPort),
		"PUBLIC_BASE_URL="+s.url,
		"MCP_API_TOKEN="+s.token,
		"SANDBOX_ROOT="+root,
		"LOG_LEVEL=warn",
		"SANDBOX_RUNTIME="+o.runtime,
	)
	env = append(env, o.env...)
	s3Addr := ""
	if o.s3 {
		s3Addr = fmt.Sprintf("127.0.0.1:%d", freePort())
		gw := exec.Command(versitygw(), "--access", "bench", "--secret", "bench-secret-key", "--port",
			s3Addr, "posix", filepath.Join(root, "s3"))
		os.MkdirAll(filepath.Join(root, "s3"), 0o700)
		if err := s.start("versitygw", gw); err != nil {
			s.stop()
			return nil, fmt.Errorf("start versitygw (make test-deps): %w", err)
		}
		env = append(env, "FILE_STORE=s3://runbox-bench", "AWS_ENDPOINT_URL=http://"+s3Addr,
			"AWS_ACCESS_KEY_ID=bench", "AWS_SECRET_ACCESS_KEY=bench-secret-key")
	}
	for i := 0; o.s3 && i < 100; i++ { // every process opens the bucket at start
		if c, err := net.Dial("tcp", s3Addr); err == nil {
			c.Close()
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	for i := range o.executors {
		name := fmt.Sprintf("executor-%d", i)
		cmd := exec.Command(filepath.Join(binDir, "executor"))
		cmd.Env = append(env, "EXECUTOR_ID=bench-"+strings.ToLower(rand.Text()[:8]))
		if o.s3 {
			dir := filepath.Join(root, name)
			os.MkdirAll(dir, 0o711)
			cmd.Env = append(cmd.Env, "SANDBOX_ROOT="+dir)
		}
		if err := s.start(name, cmd); err != nil {
			s.stop()
			return nil, err
		}
	}
	cmd := exec.Command(filepath.Join(binDir, "api"))
	cmd.Env = env
	if err := s.start("api", cmd); err != nil {
		s.stop()
		return nil, err
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		resp, err := http.Get(s.url + "/readyz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return s, nil
			}
		}
		if time.Now().After(deadline) {
			s.stop()
			var logs strings.Builder
			for name, l := range s.logs {
				fmt.Fprintf(&logs, "--- %s ---\n%s", name, l.String())
			}
			return nil, fmt.Errorf("the service did not become ready:\n%s", logs.String())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// settle waits until the executors have started the sandboxes their pools
// begin with and the machine is idle again (under a quarter of its CPU
// busy for two seconds), at most a minute and a half: a measure taken
// meanwhile would share the CPU with container starts — under gVisor
// seconds of CPU each, well after the container count is reached.
func (s *service) settle() {
	quiet := 0
	prevBusy, prevTotal := cpuTimes()
	for deadline := time.Now().Add(90 * time.Second); time.Now().Before(deadline) && quiet < 2; {
		time.Sleep(time.Second)
		busy, total := cpuTimes()
		if total > prevTotal && float64(busy-prevBusy) < 0.25*float64(total-prevTotal) {
			quiet++
		} else {
			quiet = 0
		}
		prevBusy, prevTotal = busy, total
	}
}

// cpuTimes returns the host's busy and total CPU time so far, in ticks
// (the first line of /proc/stat).
func cpuTimes() (busy, total uint64) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, 0
	}
	line, _, _ := strings.Cut(string(b), "\n")
	for i, f := range strings.Fields(line)[1:] {
		n, _ := strconv.ParseUint(f, 10, 64)
		total += n
		if i != 3 && i != 4 { // idle, iowait
			busy += n
		}
	}
	return busy, total
}

func (s *service) start(name string, cmd *exec.Cmd) error {
	var buf bytes.Buffer
	cmd.Stdout, cmd.Stderr = &buf, &buf
	if err := cmd.Start(); err != nil {
		return err
	}
	s.procs[name], s.logs[name] = cmd, &buf
	return nil
}

func (s *service) stop() {
	if s.stopped {
		return
	}
	s.stopped = true
	for _, name := range []string{"api", "executor-0", "executor-1", "redis", "versitygw"} {
		if cmd := s.procs[name]; cmd != nil {
			_ = cmd.Process.Signal(os.Interrupt)
			done := make(chan struct{})
			go func() { cmd.Wait(); close(done) }()
			select {
			case <-done:
			case <-time.After(60 * time.Second):
				cmd.Process.Kill()
			}
		}
	}
	unmountUnder(s.root)
	os.RemoveAll(s.root)
}

// cpu returns the share of one core api, executor and redis-server used
// together over d.
func (s *service) cpu(d time.Duration) float64 {
	total := func() time.Duration {
		var t time.Duration
		for _, cmd := range s.procs {
			t += cpuTime(cmd.Process.Pid)
		}
		return t
	}
	before := total()
	time.Sleep(d)
	return float64(total()-before) / float64(d)
}

// cpuTime reads the user and system time a process has used from
// /proc/<pid>/stat (in clock ticks of 10 ms).
func cpuTime(pid int) time.Duration {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	// Fields after the command name, which ends at the last ')'.
	fields := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
	if len(fields) < 13 {
		return 0
	}
	utime, _ := strconv.ParseInt(fields[11], 10, 64)
	stime, _ := strconv.ParseInt(fields[12], 10, 64)
	return time.Duration(utime+stime) * 10 * time.Millisecond
}

// sampleRSS samples the resident memory of api and executor until the
// returned function is called, which returns the peaks.
func (s *service) sampleRSS() func() map[string]int64 {
	peak := map[string]int64{}
	var mu sync.Mutex
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(50 * time.Millisecond)
		defer t.Stop()
		for {
			for _, name := range []string{"api", "executor-0"} {
				if v := rss(s.procs[name].Process.Pid); v > 0 {
					mu.Lock()
					peak[name] = max(peak[name], v)
					mu.Unlock()
				}
			}
			select {
			case <-stop:
				return
			case <-t.C:
			}
		}
	}()
	return func() map[string]int64 {
		close(stop)
		<-done
		return peak
	}
}

// rss reads a process's resident set size from /proc.
func rss(pid int) int64 {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			return kb << 10
		}
	}
	return 0
}

func unmountUnder(dir string) {
	b, _ := os.ReadFile("/proc/self/mountinfo")
	for line := range strings.SplitSeq(string(b), "\n") {
		if f := strings.Fields(line); len(f) > 4 && strings.HasPrefix(f[4], dir+"/") {
			_ = exec.Command("umount", f[4]).Run()
		}
	}
}

func freePort() int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// versitygw finds the S3 server make test-deps installs.
func versitygw() string {
	if p, err := exec.LookPath("versitygw"); err == nil {
		return p
	}
	gopath, _ := exec.Command("go", "env", "GOPATH").Output()
	return filepath.Join(strings.TrimSpace(string(gopath)), "bin", "versitygw")
}

// onlyLanguages starts the service and measures the languages alone.
func onlyLanguages(ctx context.Context, binDir string, n int) ([]row, error) {
	return onService(ctx, binDir, func(_ *service, cs *mcp.ClientSession) ([]row, error) {
		return languageRows(ctx, cs, max(n/4, 12))
	})
}

// onService starts a service with one executor and measures it with f
// over one MCP session.
func onService(ctx context.Context, binDir string, f func(*service, *mcp.ClientSession) ([]row, error)) ([]row, error) {
	svc, err := startService(binDir, serviceOptions{executors: 1})
	if err != nil {
		return nil, err
	}
	defer svc.stop()
	cs, err := bench.Client{URL: svc.url, Token: svc.token}.Session(ctx, nil)
	if err != nil {
		return nil, err
	}
	defer cs.Close()
	return f(svc, cs)
}
