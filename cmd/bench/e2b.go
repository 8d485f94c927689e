package main

import (
	"context"
	"errors"
	"fmt"
	"log"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"connectrpc.com/connect"
	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/runbox-dev/runbox/internal/bench"
	"github.com/runbox-dev/runbox/internal/e2b/e2bclient"
	ppb "github.com/runbox-dev/runbox/internal/e2b/envdpb/process"
	"github.com/runbox-dev/runbox/internal/e2b/envdpb/process/processpbconnect"
)

// e2bSandboxes is how many sandboxes each E2B row starts: the 100.
const e2bSandboxes = 100

// e2bRows measures E2B's first step as its SDKs take it — Sandbox.create()
// of the base template, then its first commands.run (`echo hi`, as
// /bin/bash -l -c) answered — 100 one after another and 100 at once,
// beside run_code of `echo hi` on the same runner, each in a new
// conversation, the same ways, on the same service. The clients are Go's
// (the control plane's generated client, connect-go): the wire E2B's SDK
// speaks. Each sandbox is killed after it is measured.
func e2bRows(ctx context.Context, svc *service, cs *mcp.ClientSession) ([]row, error) {
	c, err := e2bclient.NewClientWithResponses(svc.url+"/e2b", e2bclient.WithRequestEditorFn(
		func(_ context.Context, r *http.Request) error { r.Header.Set("X-API-Key", svc.token); return nil }))
	if err != nil {
		return nil, err
	}
	e := e2bBench{url: svc.url, api: c}
	log.Printf("e2b: create + first command, %d sequential", e2bSandboxes)
	seq, err := e.times(ctx, e2bSandboxes, 1)
	if err != nil {
		return nil, err
	}
	log.Printf("run_code shell echo hi, a new conversation each, %d sequential", e2bSandboxes)
	var base []time.Duration
	for i := range e2bSandboxes {
		start := time.Now()
		r, err := bench.RunCode(ctx, cs, map[string]any{"language": "shell", "code": "echo hi",
			"conversationId": fmt.Sprintf("bench-e2b-base-%d", i)}, nil)
		if err != nil || !r.Success {
			return nil, fmt.Errorf("run_code: %v %+v", err, r)
		}
		base = append(base, time.Since(start))
	}
	svc.settle()
	log.Printf("e2b: create + first command, %d at once", e2bSandboxes)
	par, err := e.times(ctx, e2bSandboxes, e2bSandboxes)
	if err != nil {
		return nil, err
	}
	svc.settle()
	log.Printf("run_code shell echo hi, a new conversation each, %d at once", e2bSandboxes)
	load, err := bench.Load(ctx, bench.Client{URL: svc.url, Token: svc.token}, bench.LoadConfig{Runs: e2bSandboxes,
		Clients: e2bSandboxes, Language: "shell", Code: "echo hi", NewEach: true, Prefix: "bench-e2b-load"})
	if err != nil {
		return nil, err
	}
	if load.Errors > 0 {
		return nil, fmt.Errorf("run_code at once: %d errors, the first %s", load.Errors, load.FirstError)
	}
	s, b, p := bench.Summarize(seq), bench.Summarize(base), bench.Summarize(par)
	return []row{
		e2bRow(fmt.Sprintf("E2B `Sandbox.create()` → first `commands.run` (`echo hi`) answered, %d sequential", e2bSandboxes), s, b),
		e2bRow(fmt.Sprintf("E2B `Sandbox.create()` → first `commands.run` (`echo hi`) answered, %d at once", e2bSandboxes), p, load.Latency),
	}, nil
}

func e2bRow(measure string, got, base bench.Stats) row {
	return row{measure: measure,
		result:   fmt.Sprintf("p50 %s, p99 %s", ms(got.Median), ms(got.P99)),
		baseline: fmt.Sprintf("`run_code` shell `echo hi`, a new conversation each: p50 %s, p99 %s", ms(base.Median), ms(base.P99)),
		ratio:    ratio(got.Median, base.Median), target: "—", met: true}
}

// e2bBench makes sandboxes and runs their first command.
type e2bBench struct {
	url string
	api *e2bclient.ClientWithResponses
}

// times measures n sandboxes' create and first command, at most at
// once at a time.
func (e e2bBench) times(ctx context.Context, n, atOnce int) ([]time.Duration, error) {
	var (
		mu    sync.Mutex
		times []time.Duration
		errs  []error
		wg    sync.WaitGroup
	)
	slots := make(chan struct{}, atOnce)
	for range n {
		slots <- struct{}{}
		wg.Go(func() {
			defer func() { <-slots }()
			d, err := e.first(ctx)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs = append(errs, err)
				return
			}
			times = append(times, d)
		})
	}
	wg.Wait()
	if len(errs) > 0 {
		return nil, fmt.Errorf("%d of %d sandboxes failed, the first: %w", len(errs), n, errs[0])
	}
	return times, nil
}

// first creates a sandbox, runs `echo hi` in it and returns how long both
// took; the sandbox is then killed.
func (e e2bBench) first(ctx context.Context) (time.Duration, error) {
	timeout := int32(300)
	start := time.Now()
	r, err := e.api.CreateSandboxWithResponse(ctx, e2bclient.NewSandbox{TemplateID: "base", Timeout: &timeout})
	if err != nil {
		return 0, err
	}
	if r.JSON201 == nil {
		return 0, fmt.Errorf("create: %d %s", r.StatusCode(), r.Body)
	}
	id := r.JSON201.SandboxID
	defer func() { _, _ = e.api.KillSandboxWithResponse(context.WithoutCancel(ctx), id) }()
	hc := &http.Client{Transport: e2bHeaders{id: id, token: *r.JSON201.EnvdAccessToken}}
	procs := processpbconnect.NewProcessClient(hc, e.url+"/e2b", connect.WithProtoJSON())
	stream, err := procs.Start(ctx, connect.NewRequest(&ppb.StartRequest{
		Process: &ppb.ProcessConfig{Cmd: "/bin/bash", Args: []string{"-l", "-c", "echo hi"}}}))
	if err != nil {
		return 0, err
	}
	defer stream.Close()
	var out strings.Builder
	for stream.Receive() {
		out.Write(stream.Msg().GetEvent().GetData().GetStdout())
		if end := stream.Msg().GetEvent().GetEnd(); end != nil {
			d := time.Since(start)
			if end.GetExitCode() != 0 || out.String() != "hi\n" {
				return 0, fmt.Errorf("echo hi: %q %v", out.String(), end)
			}
			return d, nil
		}
	}
	return 0, errors.Join(errors.New("the command's stream ended without its end"), stream.Err())
}

// e2bHeaders routes requests to a sandbox's daemon, as E2B's SDK does.
type e2bHeaders struct{ id, token string }

func (h e2bHeaders) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("E2b-Sandbox-Id", h.id)
	r.Header.Set("E2b-Sandbox-Port", "49983")
	r.Header.Set("X-Access-Token", h.token)
	return http.DefaultTransport.RoundTrip(r)
}

// onlyE2B measures the E2B rows on a service of their own, on which
// every sandbox may run at once: each is a background run, which leaves
// its executor slot only within EXECUTOR_MAX_DETACHED (32 by default),
// and the client may have all its calls in flight (concurrent_requests,
// 64 by default).
func onlyE2B(ctx context.Context, binDir string, _ int) ([]row, error) {
	dir, err := os.MkdirTemp("", "runbox-bench-e2b-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	file := filepath.Join(dir, "clients.yaml")
	tiers := fmt.Sprintf("tiers:\n  unlimited: {concurrent_requests: %d}\n", 3*e2bSandboxes)
	if err := os.WriteFile(file, []byte(tiers), 0o600); err != nil {
		return nil, err
	}
	o := serviceOptions{executors: 1, env: []string{fmt.Sprintf("EXECUTOR_MAX_DETACHED=%d", e2bSandboxes+10), "CLIENTS_FILE=" + file}}
	return onServiceWith(ctx, binDir, o, func(svc *service, cs *mcp.ClientSession) ([]row, error) {
		return e2bRows(ctx, svc, cs)
	})
}
