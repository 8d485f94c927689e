package e2e

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/runbox-dev/runbox/internal/testenv"
)

// batchRuns is the runs of each of TestBatchLoad's ten batches: 100 in
// CI; -batch-runs=1000 is the full load (10,000 runs).
var batchRuns = flag.Int("batch-runs", 100, "runs in each of TestBatchLoad's ten batches")

// requestAs is service.request with another client's token.
func (s *service) requestAs(tok, method, path string, body, out any) int {
	s.t.Helper()
	var r io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		r = bytes.NewReader(b)
	}
	req, _ := http.NewRequest(method, s.url+path, r)
	req.Header.Set("Authorization", "Bearer "+tok)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		s.t.Fatal(err)
	}
	defer resp.Body.Close()
	if out != nil {
		if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
			s.t.Fatalf("%s %s: decode answer: %v", method, path, err)
		}
	}
	return resp.StatusCode
}

type batchCreated struct {
	BatchID string   `json:"batch_id"`
	RunIDs  []string `json:"run_ids"`
}

type batchPage struct {
	BatchID    string `json:"batch_id"`
	Total      int    `json:"total"`
	Queued     int    `json:"queued"`
	Running    int    `json:"running"`
	Succeeded  int    `json:"succeeded"`
	Failed     int    `json:"failed"`
	Cancelled  int    `json:"cancelled"`
	NextCursor string `json:"next_cursor"`
	Runs       []struct {
		RunID  string  `json:"run_id"`
		Status string  `json:"status"`
		Result *result `json:"result"`
	} `json:"runs"`
}

func (b batchPage) done() bool { return b.Succeeded+b.Failed+b.Cancelled == b.Total }

// echoes is a batch of n bash runs, run i printing i.
func echoes(n int) []map[string]any {
	runs := make([]map[string]any, n)
	for i := range runs {
		runs[i] = map[string]any{"language": "bash", "code": fmt.Sprintf("echo %d", i)}
	}
	return runs
}

// TestBatches: a batch is refused whole for one bad run, naming it; a
// batch runs, tells its callback when its last run ends, and pages its
// runs' results; MCP has the same; DELETE cancels what has not ended; a
// batch past its client's concurrent runs waits rather than is refused.
func TestBatches(t *testing.T) {
	rcv := newHookReceiver(t, 0)
	clients := filepath.Join(t.TempDir(), "clients.yaml")
	if err := os.WriteFile(clients, []byte(`
tiers:
  pair: {concurrent_runs: 2}
clients:
  - {name: carol, token: `+carolToken+`, tier: pair}
`), 0o600); err != nil {
		t.Fatal(err)
	}
	s := start(t, options{env: append(webhookEnv(rcv), "CLIENTS_FILE="+clients)})
	recv := "http://recv.test:" + rcv.port()

	t.Run("one bad run of 1000 refuses the batch", func(t *testing.T) {
		runs := echoes(1000)
		runs[617]["code"] = ""
		var e struct{ Error, Message string }
		if code := s.request("POST", "/v1/batches", map[string]any{"runs": runs}, &e); code != http.StatusBadRequest ||
			e.Error != "invalid_argument" || !strings.HasPrefix(e.Message, "runs[617]: ") {
			t.Fatalf("POST /v1/batches: %d %+v", code, e)
		}
		var list struct {
			Runs []any `json:"runs"`
		}
		if s.request("GET", "/v1/runs", nil, &list); len(list.Runs) != 0 {
			t.Fatalf("the refused batch left %d runs", len(list.Runs))
		}
	})

	t.Run("runs, webhook, pages", func(t *testing.T) {
		var created batchCreated
		if code := s.request("POST", "/v1/batches", map[string]any{"runs": echoes(30), "callback_url": recv + "/batch"}, &created); code != http.StatusCreated ||
			len(created.RunIDs) != 30 {
			t.Fatalf("POST /v1/batches: %d %+v", code, created)
		}
		got := rcv.accepted(t, "msg_"+created.BatchID+"_completed", 2*time.Minute)
		var env envelope
		var counts batchPage
		if json.Unmarshal(got[0].Body, &env) != nil || json.Unmarshal(env.Data, &counts) != nil || env.Type != "batch.completed" ||
			counts.BatchID != created.BatchID || counts.Total != 30 || counts.Succeeded != 30 || !got[0].Verified {
			t.Fatalf("batch webhook %s", got[0].Body)
		}
		var ids []string
		cursor := ""
		for {
			var p batchPage
			path := "/v1/batches/" + created.BatchID + "?limit=12"
			if cursor != "" {
				path += "&cursor=" + cursor
			}
			if code := s.request("GET", path, nil, &p); code != http.StatusOK || !p.done() || p.Succeeded != 30 {
				t.Fatalf("GET %s: %d %+v", path, code, p)
			}
			for _, r := range p.Runs {
				if r.Result == nil || r.Result.Stdout != fmt.Sprintf("%d\n", len(ids)) {
					t.Fatalf("run %d: %+v", len(ids), r)
				}
				ids = append(ids, r.RunID)
			}
			if cursor = p.NextCursor; cursor == "" {
				break
			}
		}
		if !slices.Equal(ids, created.RunIDs) {
			t.Fatalf("pages hold %v", ids)
		}
		// Another client does not see it.
		if code := s.requestAs(carolToken, "GET", "/v1/batches/"+created.BatchID, nil, nil); code != http.StatusNotFound {
			t.Errorf("another client's GET: %d", code)
		}
		var ds []delivery
		if s.request("GET", "/v1/batches/"+created.BatchID+"/deliveries", nil, &ds); len(ds) != 1 || ds[0].StatusCode != 200 {
			t.Errorf("deliveries %+v", ds)
		}
	})

	t.Run("MCP", func(t *testing.T) {
		cs := s.session(nil)
		var created batchCreated
		res := call(t, cs, "start_batch", map[string]any{"runs": echoes(5)}, &created)
		if res.IsError || len(created.RunIDs) != 5 {
			t.Fatalf("start_batch: %s", text(res))
		}
		var p batchPage
		waitFor(t, func() bool {
			call(t, cs, "get_batch", map[string]any{"batch_id": created.BatchID}, &p)
			return p.done()
		})
		if p.Succeeded != 5 || len(p.Runs) != 5 || p.Runs[4].Result == nil || p.Runs[4].Result.Stdout != "4\n" {
			t.Fatalf("get_batch: %+v", p)
		}
		runs := echoes(3)
		runs[1]["language"] = "cobol"
		res = call(t, cs, "start_batch", map[string]any{"runs": runs}, nil)
		if !res.IsError || !strings.Contains(text(res), "runs[1]: ") {
			t.Fatalf("start_batch with a bad run: %s", text(res))
		}
	})

	t.Run("cancel", func(t *testing.T) {
		runs := make([]map[string]any, 8)
		for i := range runs {
			runs[i] = map[string]any{"language": "bash", "code": "sleep 60"}
		}
		var created batchCreated
		s.request("POST", "/v1/batches", map[string]any{"runs": runs}, &created)
		var p batchPage
		waitFor(t, func() bool {
			s.request("GET", "/v1/batches/"+created.BatchID, nil, &p)
			return p.Running > 0
		})
		if code := s.request("DELETE", "/v1/batches/"+created.BatchID, nil, &p); code != http.StatusOK || p.Queued != 0 || len(p.Runs) != 8 {
			t.Fatalf("DELETE: %d %+v", code, p)
		}
		waitFor(t, func() bool {
			s.request("GET", "/v1/batches/"+created.BatchID, nil, &p)
			return p.done()
		})
		if p.Cancelled != 8 {
			t.Fatalf("after the cancel: %+v", p)
		}
	})

	t.Run("concurrency waits", func(t *testing.T) {
		runs := make([]map[string]any, 6)
		for i := range runs {
			runs[i] = map[string]any{"language": "bash", "code": fmt.Sprintf("sleep 1; echo %d", i)}
		}
		var created batchCreated
		if code := s.requestAs(carolToken, "POST", "/v1/batches", map[string]any{"runs": runs}, &created); code != http.StatusCreated {
			t.Fatalf("a batch past the client's concurrent runs: %d", code)
		}
		if code := s.requestAs(carolToken, "POST", "/v1/runs", map[string]any{"language": "bash", "code": "true"}, nil); code != http.StatusTooManyRequests {
			t.Errorf("a run alone past the limit: %d", code)
		}
		var p batchPage
		most := 0
		deadline := time.Now().Add(2 * time.Minute)
		for {
			if code := s.requestAs(carolToken, "GET", "/v1/batches/"+created.BatchID, nil, &p); code != http.StatusOK {
				t.Fatalf("GET %s: %d", created.BatchID, code)
			}
			most = max(most, p.Running)
			if p.done() {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("batch %+v", p)
			}
			time.Sleep(50 * time.Millisecond)
		}
		if p.Succeeded != 6 || most > 2 {
			t.Fatalf("batch %+v; at most %d running at once", p, most)
		}
	})
}

// TestBatchLoad: ten batches from one client run to their end with
// nothing lost or run twice, while the batch endpoints keep answering.
// CI runs 10 × 100; -batch-runs=1000 runs the 10,000.
func TestBatchLoad(t *testing.T) {
	metricsPort := testenv.FreePort(t)
	// Ten batches share sixteen conversations: up to 63 runs wait in one.
	s := start(t, options{env: []string{"EXECUTOR_METRICS_ADDR=127.0.0.1:" + strconv.Itoa(metricsPort),
		"SANDBOX_MAX_QUEUED_PER_CONVERSATION=" + strconv.Itoa(*batchRuns*10/16+1)}})
	per := *batchRuns
	const batches, conversations = 10, 16
	began := time.Now()
	created := make([]batchCreated, batches)
	var wg sync.WaitGroup
	for b := range batches {
		wg.Go(func() {
			runs := make([]map[string]any, per)
			for i := range runs {
				runs[i] = map[string]any{"language": "bash", "code": fmt.Sprintf("echo %d-%d", b, i),
					"conversationId": fmt.Sprintf("load-%d", (b*per+i)%conversations)}
			}
			if code := s.request("POST", "/v1/batches", map[string]any{"runs": runs}, &created[b]); code != http.StatusCreated {
				t.Errorf("batch %d: %d", b, code)
			}
		})
	}
	wg.Wait()
	if t.Failed() {
		return
	}
	submitted := time.Since(began)

	// Every batch is looked at, over and over, until all are done.
	var latencies []time.Duration
	deadline := time.Now().Add(time.Duration(per) * 3 * time.Second)
	for done := 0; done < batches; {
		done = 0
		for _, c := range created {
			var p batchPage
			t0 := time.Now()
			if code := s.request("GET", "/v1/batches/"+c.BatchID+"?limit=1", nil, &p); code != http.StatusOK {
				t.Fatalf("GET a batch while they run: %d", code)
			}
			latencies = append(latencies, time.Since(t0))
			if p.done() {
				done++
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d of %d batches done by the deadline", done, batches)
		}
		time.Sleep(100 * time.Millisecond)
	}
	took := time.Since(began)

	for b, c := range created {
		seen := 0
		cursor := ""
		for {
			var p batchPage
			path := "/v1/batches/" + c.BatchID + "?limit=200"
			if cursor != "" {
				path += "&cursor=" + cursor
			}
			s.request("GET", path, nil, &p)
			if p.Succeeded != per {
				t.Fatalf("batch %d: %+v", b, p)
			}
			for _, r := range p.Runs {
				if r.Status != "succeeded" || r.Result == nil || r.Result.Stdout != fmt.Sprintf("%d-%d\n", b, seen) {
					t.Fatalf("batch %d run %d: %+v", b, seen, r)
				}
				seen++
			}
			if cursor = p.NextCursor; cursor == "" {
				break
			}
		}
		if seen != per {
			t.Fatalf("batch %d pages %d runs", b, seen)
		}
	}
	// Run once each: the executor finished as many runs as were sent.
	_, m := get(t, fmt.Sprintf("http://127.0.0.1:%d/metrics", metricsPort))
	finished := 0.0
	for line := range strings.SplitSeq(string(m), "\n") {
		if strings.HasPrefix(line, "runbox_runs_finished_total{") {
			var v float64
			fmt.Sscan(line[strings.LastIndex(line, " ")+1:], &v)
			finished += v
		}
	}
	if int(finished) != batches*per {
		t.Errorf("the executor finished %v runs; %d were sent", finished, batches*per)
	}
	slices.Sort(latencies)
	t.Logf("%d runs in %d batches: submitted in %v, all done in %v (%.1f runs/s); GET /v1/batches/{id} while they ran: p50 %v, p99 %v, max %v (%d requests)",
		batches*per, batches, submitted.Round(time.Millisecond), took.Round(time.Millisecond), float64(batches*per)/took.Seconds(),
		latencies[len(latencies)/2], latencies[len(latencies)*99/100], latencies[len(latencies)-1], len(latencies))
}
