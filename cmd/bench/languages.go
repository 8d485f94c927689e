package main

import (
	"cmp"
	"context"
	"fmt"
	"log"
	"os"
	"strings"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/runbox-dev/runbox/internal/bench"
)

// languageRows measures hello world in each language of bench.Hellos over
// /mcp, in a warm sandbox, beside `docker exec` of the same program
// compiled and run in an already running container of the same image;
// the samples of both alternate, so that they share the machine's state.
// A compiled language gets two rows: a new program each time (compiled
// each time, as the baseline is) and the same program again (its binary
// from the sandbox's build cache).
func languageRows(ctx context.Context, cs *mcp.ClientSession, n int) ([]row, error) {
	tag := cmp.Or(os.Getenv("RUNNER_TAG"), "latest")
	var rows []row
	for _, h := range bench.Hellos {
		r, err := helloRows(ctx, cs, h, tag, n)
		if err != nil {
			return nil, err
		}
		rows = append(rows, r...)
	}
	return rows, nil
}

// helloRows measures hello world in h's language: its row, and for a
// compiled language the row of the same program again.
func helloRows(ctx context.Context, cs *mcp.ClientSession, h bench.Hello, tag string, n int) ([]row, error) {
	log.Printf("%s: hello world over /mcp and with docker exec", h.Language)
	ctr, err := bench.StartExecContainer(ctx, "runner-"+h.Language+":"+tag)
	if err != nil {
		return nil, err
	}
	base, fresh, again, err := helloTimes(ctx, cs, ctr, h, n)
	if err != nil {
		return nil, err
	}
	b, f := bench.Summarize(base), bench.Summarize(fresh)
	limit, what := 0.5, "hello world"
	if h.Compiled {
		limit, what = 1.2, "hello world, a new program each time (compiled each time)"
	}
	baseline := "`docker exec` " + strings.ReplaceAll(h.Exec, "|", "\\|") + " " + ms(b.Median)
	rows := []row{{
		measure:  fmt.Sprintf("`%s` %s over `/mcp`, warm", h.Language, what),
		result:   pair(f),
		baseline: baseline,
		ratio:    ratio(f.Median, b.Median),
		target:   fmt.Sprintf("≤ %.1f×", limit),
		met:      float64(f.Median) <= limit*float64(b.Median),
	}}
	if h.Compiled {
		a := bench.Summarize(again)
		rows = append(rows, row{
			measure:  fmt.Sprintf("`%s` the same hello world again (the sandbox's build cache)", h.Language),
			result:   pair(a),
			baseline: baseline,
			ratio:    ratio(a.Median, b.Median),
			target:   "≤ 1.2×",
			met:      float64(a.Median) <= 1.2*float64(b.Median),
		})
	}
	return rows, nil
}

// helloTimes times n hello worlds with `docker exec` in ctr (base) and
// over /mcp (fresh: a new program each time; again: for a compiled
// language, the first program again), alternating; ctr is removed after.
func helloTimes(ctx context.Context, cs *mcp.ClientSession, ctr *bench.Container, h bench.Hello, n int) (base, fresh, again []time.Duration, err error) {
	defer ctr.Remove()
	cid := "bench-lang-" + h.Language
	run := func(i int) (time.Duration, error) {
		t := time.Now()
		r, err := bench.RunCode(ctx, cs, map[string]any{"language": h.Language, "conversationId": cid, "code": h.Code(i)}, nil)
		if err != nil {
			return 0, err
		}
		if want := fmt.Sprintf("hello %d\n", i); r.Stdout != want {
			return 0, fmt.Errorf("%s: stdout %q, want %q", h.Language, r.Stdout, want)
		}
		return time.Since(t), nil
	}
	for i := range 2 { // the container's and the sandbox's first runs
		if _, err := ctr.ExecHello(ctx, h, 900+i); err != nil {
			return nil, nil, nil, err
		}
		if _, err := run(900 + i); err != nil {
			return nil, nil, nil, err
		}
	}
	for i := range n {
		d, err := ctr.ExecHello(ctx, h, i)
		if err != nil {
			return nil, nil, nil, err
		}
		base = append(base, d)
		if d, err = run(i); err != nil {
			return nil, nil, nil, err
		}
		fresh = append(fresh, d)
		if h.Compiled {
			if d, err = run(0); err != nil {
				return nil, nil, nil, err
			}
			again = append(again, d)
		}
	}
	return base, fresh, again, nil
}

// onlyLanguages starts the service and measures the languages alone.
func onlyLanguages(ctx context.Context, binDir string, n int) ([]row, error) {
	return onService(ctx, binDir, func(_ *service, cs *mcp.ClientSession) ([]row, error) {
		return languageRows(ctx, cs, max(n/4, 12))
	})
}
