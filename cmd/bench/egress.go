package main

import (
	"context"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os/exec"
	"strconv"
	"strings"
	"time"

	"github.com/runbox-dev/runbox/internal/bench"
)

// getTimer GETs a URL of 1 MB n times, each on a new connection (through
// HTTP_PROXY when it is set), after three to warm up, and prints each
// time in seconds.
const getTimer = `import time, urllib.request
url, n = %q, %d
opener = urllib.request.build_opener()
for i in range(n + 3):
    t = time.perf_counter()
    body = opener.open(url).read()
    d = time.perf_counter() - t
    assert len(body) == 1 << 20, len(body)
    if i >= 3:
        print(d)
`

// egressRows measures egress: a 1 MB GET from a loopback server through
// the proxy, timed inside the sandbox, against the same GET made on this
// host; and warm print(1) of a run that asks for no network, on a service
// with egress configured, against warm (the same measure without egress,
// this run; measured here if nil).
func egressRows(ctx context.Context, binDir string, n int, warm *bench.Stats) ([]row, error) {
	if warm == nil {
		log.Print("warm print(1), egress not configured")
		svc, err := startService(binDir, serviceOptions{executors: 1})
		if err != nil {
			return nil, err
		}
		s, err := warmPrint(ctx, svc, n)
		svc.stop()
		if err != nil {
			return nil, err
		}
		warm = &s
	}
	mb := make([]byte, 1<<20)
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", strconv.Itoa(len(mb)))
		w.Write(mb)
	}), ReadHeaderTimeout: 10 * time.Second}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	go srv.Serve(ln)
	defer srv.Close()
	port := ln.Addr().(*net.TCPAddr).Port
	svc, err := startService(binDir, serviceOptions{executors: 1, env: []string{
		"SANDBOX_EGRESS_ALLOW=files.bench", fmt.Sprintf("SANDBOX_EGRESS_HOSTS=files.bench=127.0.0.1:%d", port)}})
	if err != nil {
		return nil, err
	}
	defer svc.stop()

	log.Print("warm print(1), no network asked, egress configured")
	quiet, err := warmPrint(ctx, svc, n)
	if err != nil {
		return nil, err
	}

	log.Print("1 MB GET through the egress proxy vs on the host")
	// GETs are cheap (ms each): many, so that the medians hold still on a
	// loaded machine.
	gets := max(5*n, 200)
	client := bench.Client{URL: svc.url, Token: svc.token}
	cs, err := client.Session(ctx, nil)
	if err != nil {
		return nil, err
	}
	defer cs.Close()
	res, err := bench.RunCode(ctx, cs, map[string]any{"language": "python", "conversationId": "bench-egress",
		"code":    fmt.Sprintf(getTimer, fmt.Sprintf("http://files.bench:%d/", port), gets),
		"network": map[string]any{"allowed_domains": []string{"files.bench"}}}, nil)
	if err != nil {
		return nil, err
	}
	through, err := seconds(res.Stdout)
	if err != nil {
		return nil, fmt.Errorf("GETs through the proxy: %w (%s %s)", err, res.Stderr, res.Error)
	}
	direct, how, err := hostGets(ctx, fmt.Sprintf("http://127.0.0.1:%d/", port), gets)
	if err != nil {
		return nil, err
	}
	t, d := bench.Summarize(through), bench.Summarize(direct)
	return []row{{
		measure:  "1 MB `GET` from a loopback server through the egress proxy (Python `urllib` in the sandbox, a new connection each)",
		result:   pair(t),
		baseline: "the same `GET` on the host (" + how + ") " + pair(d),
		ratio:    ratio(t.Median, d.Median),
		target:   "≤ 1.3×",
		met:      float64(t.Median) <= 1.3*float64(d.Median),
	}, {
		measure:  "`run_code` `print(1)`, sequential, warm, no network asked, egress configured",
		result:   pair(quiet),
		baseline: "egress not configured " + ms(warm.Median),
		ratio:    ratio(quiet.Median, warm.Median),
		target:   "unchanged (≤ 1.1×)",
		met:      float64(quiet.Median) <= 1.1*float64(warm.Median),
	}}, nil
}

func warmPrint(ctx context.Context, svc *service, n int) (bench.Stats, error) {
	cs, err := bench.Client{URL: svc.url, Token: svc.token}.Session(ctx, nil)
	if err != nil {
		return bench.Stats{}, err
	}
	defer cs.Close()
	lat, _, err := bench.Sequential(ctx, cs, "bench-quiet", "python", "print(1)", 5, n)
	return bench.Summarize(lat), err
}

// hostGets times the same GETs on this host: with python3 and urllib, as
// in the sandbox, where the host has python3; else with Go's client.
func hostGets(ctx context.Context, url string, n int) ([]time.Duration, string, error) {
	if py, err := exec.LookPath("python3"); err == nil {
		out, err := exec.CommandContext(ctx, py, "-c", fmt.Sprintf(getTimer, url, n)).Output()
		if err != nil {
			return nil, "", fmt.Errorf("python3 on the host: %w", err)
		}
		d, err := seconds(string(out))
		return d, "Python `urllib`", err
	}
	c := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}}
	var out []time.Duration
	for i := range n + 3 {
		t := time.Now()
		resp, err := c.Get(url)
		if err != nil {
			return nil, "", err
		}
		_, err = io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
		if err != nil {
			return nil, "", err
		}
		if i >= 3 {
			out = append(out, time.Since(t))
		}
	}
	return out, "Go's client", nil
}

// seconds reads one duration in seconds a line.
func seconds(s string) ([]time.Duration, error) {
	var out []time.Duration
	for line := range strings.Lines(strings.TrimSpace(s)) {
		f, err := strconv.ParseFloat(strings.TrimSpace(line), 64)
		if err != nil {
			return nil, fmt.Errorf("not a time: %q", line)
		}
		out = append(out, time.Duration(f*float64(time.Second)))
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no times")
	}
	return out, nil
}
