package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"sync"
	"sync/atomic"
	"time"
)

// SubmitConfig is a set of runs a back end submits over REST and waits
// for: Runs bash programs (run i prints i), spread over Conversations.
type SubmitConfig struct {
	Runs          int
	Conversations int
	Prefix        string
	// BatchSize is the runs of each POST /v1/batches (at most 1000).
	BatchSize int
	// Submitters are the concurrent clients submitting one by one.
	Submitters int
}

func (cfg SubmitConfig) run(i int) map[string]any {
	return map[string]any{"language": "bash", "code": fmt.Sprintf("echo %d", i),
		"conversationId": fmt.Sprintf("%s-%d", cfg.Prefix, i%max(cfg.Conversations, 1))}
}

// rest makes a REST call and decodes its answer.
func (c Client) rest(ctx context.Context, method, path string, body, out any) (int, error) {
	var b []byte
	if body != nil {
		var err error
		if b, err = json.Marshal(body); err != nil {
			return 0, err
		}
	}
	req, err := http.NewRequestWithContext(ctx, method, c.URL+path, bytes.NewReader(b))
	if err != nil {
		return 0, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := (&http.Client{Transport: authTransport{token: c.Token}}).Do(req)
	if err != nil {
		return 0, err
	}
	defer resp.Body.Close()
	if out != nil && resp.StatusCode < 300 {
		if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
			return resp.StatusCode, err
		}
	}
	return resp.StatusCode, nil
}

// OneByOne submits cfg's runs one POST /v1/runs each, from cfg.Submitters
// clients at once (a run refused busy — its conversation's queue full —
// is sent again shortly, as a client would), then waits for every one to
// end. Elapsed is from the first submission to the last end.
func OneByOne(ctx context.Context, c Client, cfg SubmitConfig) (LoadResult, error) {
	ids := make([]string, cfg.Runs)
	var (
		next   atomic.Int64
		wg     sync.WaitGroup
		mu     sync.Mutex
		failed error
	)
	start := time.Now()
	for range max(cfg.Submitters, 1) {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= cfg.Runs {
					return
				}
				for {
					var acc struct {
						RunID string `json:"run_id"`
					}
					code, err := c.rest(ctx, http.MethodPost, "/v1/runs", cfg.run(i), &acc)
					if err == nil && code == http.StatusAccepted {
						ids[i] = acc.RunID
						break
					}
					if err == nil && code == http.StatusTooManyRequests && ctx.Err() == nil {
						time.Sleep(100 * time.Millisecond)
						continue
					}
					mu.Lock()
					failed = fmt.Errorf("POST /v1/runs: %d %v", code, err)
					mu.Unlock()
					return
				}
			}
		})
	}
	wg.Wait()
	if failed != nil {
		return LoadResult{}, failed
	}
	errs, err := c.awaitRuns(ctx, ids)
	return LoadResult{Runs: cfg.Runs, Errors: errs, Elapsed: time.Since(start)}, err
}

// awaitRuns waits for runs ids to end and counts those that did not
// succeed.
func (c Client) awaitRuns(ctx context.Context, ids []string) (int, error) {
	errs := 0
	for _, id := range ids {
		for {
			var run struct {
				Status string `json:"status"`
			}
			if _, err := c.rest(ctx, http.MethodGet, "/v1/runs/"+id, nil, &run); err != nil {
				return errs, err
			}
			if run.Status != "queued" && run.Status != "running" {
				if run.Status != "succeeded" {
					errs++
				}
				break
			}
			select {
			case <-ctx.Done():
				return errs, ctx.Err()
			case <-time.After(50 * time.Millisecond):
			}
		}
	}
	return errs, nil
}

// Batched submits cfg's runs in batches of cfg.BatchSize (POST
// /v1/batches), then waits for every batch to end. Elapsed is from the
// first submission to the last end.
func Batched(ctx context.Context, c Client, cfg SubmitConfig) (LoadResult, error) {
	start := time.Now()
	var batches []string
	for from := 0; from < cfg.Runs; from += cfg.BatchSize {
		var runs []map[string]any
		for i := from; i < min(from+cfg.BatchSize, cfg.Runs); i++ {
			runs = append(runs, cfg.run(i))
		}
		var created struct {
			BatchID string `json:"batch_id"`
		}
		code, err := c.rest(ctx, http.MethodPost, "/v1/batches", map[string]any{"runs": runs}, &created)
		if err != nil || code != http.StatusCreated {
			return LoadResult{}, fmt.Errorf("POST /v1/batches: %d %v", code, err)
		}
		batches = append(batches, created.BatchID)
	}
	errs := 0
	for _, id := range batches {
		for {
			var b struct {
				Total, Succeeded, Failed, Cancelled int
			}
			if _, err := c.rest(ctx, http.MethodGet, "/v1/batches/"+id+"?limit=1", nil, &b); err != nil {
				return LoadResult{}, err
			}
			if b.Succeeded+b.Failed+b.Cancelled == b.Total {
				errs += b.Failed + b.Cancelled
				break
			}
			select {
			case <-ctx.Done():
				return LoadResult{}, ctx.Err()
			case <-time.After(50 * time.Millisecond):
			}
		}
	}
	return LoadResult{Runs: cfg.Runs, Errors: errs, Elapsed: time.Since(start)}, nil
}

// Waited submits n bash echo runs one after another (POST /v1/runs, its
// answer waited for) and returns how long each took, to its result.
func Waited(ctx context.Context, c Client, n int) ([]time.Duration, error) {
	out := make([]time.Duration, 0, n)
	for i := range n {
		t0 := time.Now()
		var res struct {
			Stdout string `json:"stdout"`
		}
		code, err := c.rest(ctx, "POST", "/v1/runs?wait=true", map[string]any{"language": "bash", "code": fmt.Sprintf("echo %d", i)}, &res)
		switch {
		case err != nil:
			return nil, err
		case code != http.StatusOK || res.Stdout != fmt.Sprintf("%d\n", i):
			return nil, fmt.Errorf("run %d: %d %q", i, code, res.Stdout)
		}
		out = append(out, time.Since(t0))
	}
	return out, nil
}

// Flood queues runs of `sleep 1`, in batches of at most 1000, and returns
// the batches' ids.
func Flood(ctx context.Context, c Client, runs int) ([]string, error) {
	var ids []string
	for runs > 0 {
		n := min(runs, 1000)
		batch := make([]map[string]any, n)
		for i := range batch {
			batch[i] = map[string]any{"language": "bash", "code": "sleep 1"}
		}
		var created struct {
			BatchID string `json:"batch_id"`
		}
		code, err := c.rest(ctx, "POST", "/v1/batches", map[string]any{"runs": batch}, &created)
		if err != nil {
			return ids, err
		}
		if code != http.StatusCreated {
			return ids, fmt.Errorf("POST /v1/batches: %d", code)
		}
		ids = append(ids, created.BatchID)
		runs -= n
	}
	return ids, nil
}

// CancelBatches cancels what has not ended of the batches.
func CancelBatches(ctx context.Context, c Client, ids []string) {
	for _, id := range ids {
		_, _ = c.rest(ctx, "DELETE", "/v1/batches/"+id, nil, nil)
	}
}
