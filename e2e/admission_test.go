package e2e

import (
	"bytes"
	"encoding/json"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/runbox-dev/runbox/internal/testenv"
)

const (
	floodToken     = "flood-token-0123456789"
	bystanderToken = "bystander-token-0123456789"
	dayToken       = "day-token-0123456789"
)

// redisMaxMemory is the Redis of TestOneClient: full, as deployed
// (noeviction), though smaller, so that a flood would reach it fast.
const redisMaxMemory = 96 << 20

// TestOneClient: one client cannot take the service from the others
// through the queue. A flood of batches stops at the client's bound
// (busy, Retry-After), far below Redis's maxmemory, and another client
// is served meanwhile; with thousands of one client's runs queued,
// another's run starts as soon as a slot frees; a batch past its
// conversation's waiting runs or its tier's run-seconds is refused whole.
func TestOneClient(t *testing.T) {
	file := filepath.Join(t.TempDir(), "clients.yaml")
	os.WriteFile(file, []byte(`
tiers:
  day20: {run_seconds_per_day: 20}
clients:
  - {name: day, token: `+dayToken+`, tier: day20}
`), 0o600)
	s := start(t, options{
		env: []string{
			"MCP_API_TOKENS=flood:" + floodToken + ",bystander:" + bystanderToken,
			"CLIENTS_FILE=" + file,
		},
		redisArgs: []string{"--maxmemory", strconv.Itoa(redisMaxMemory), "--maxmemory-policy", "noeviction"},
		engine:    "docker",
	})
	rdb := testenv.Client(t, s.redisURL)
	used := func() int64 { return redisUsed(t, rdb) }
	sleeps := func(n int, pad int) []map[string]any {
		runs := make([]map[string]any, n)
		for i := range runs {
			runs[i] = map[string]any{"language": "bash", "code": "sleep 1 #" + strings.Repeat("x", pad)}
		}
		return runs
	}
	// served is how long another client's run takes from its call to its
	// result.
	served := func() time.Duration {
		t.Helper()
		t0 := time.Now()
		var res result
		code := s.requestAs(bystanderToken, "POST", "/v1/runs?wait=true", map[string]any{"language": "bash", "code": "echo served"}, &res)
		if code != http.StatusOK || res.Stdout != "served\n" {
			t.Fatalf("another client's run: %d %+v", code, res)
		}
		return time.Since(t0)
	}
	cancel := func(tok string, ids ...string) {
		for _, id := range ids {
			if code := s.requestAs(tok, "DELETE", "/v1/batches/"+id, nil, nil); code != http.StatusOK {
				t.Errorf("cancel batch %s: %d", id, code)
			}
		}
	}

	t.Run("a flood of batches stops at the client's bound", func(t *testing.T) {
		before := used()
		var ids []string
		refused := 0
		const calls = 4
		for i := range calls {
			b, _ := json.Marshal(map[string]any{"runs": sleeps(1000, 20<<10)})
			req, _ := http.NewRequest("POST", s.url+"/v1/batches", bytes.NewReader(b))
			req.Header.Set("Authorization", "Bearer "+floodToken)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			var answer struct {
				batchCreated
				Error, Message string
			}
			json.NewDecoder(resp.Body).Decode(&answer)
			resp.Body.Close()
			switch resp.StatusCode {
			case http.StatusCreated:
				ids = append(ids, answer.BatchID)
			case http.StatusTooManyRequests:
				if answer.Error != "busy" || resp.Header.Get("Retry-After") == "" {
					t.Fatalf("call %d refused: %+v, Retry-After %q", i, answer, resp.Header.Get("Retry-After"))
				}
				refused++
			default:
				t.Fatalf("call %d: %d %+v", i, resp.StatusCode, answer)
			}
		}
		grew := used() - before
		t.Logf("%d calls of 1000 runs × 20 KiB: %d accepted, %d refused busy; Redis grew %d MiB (maxmemory %d MiB)",
			calls, len(ids), refused, grew>>20, redisMaxMemory>>20)
		if len(ids) == 0 || refused == 0 || grew > redisMaxMemory/2 {
			t.Fatalf("the flood: %d accepted, %d refused, Redis grew %d bytes", len(ids), refused, grew)
		}
		took := served()
		t.Logf("another client's run during the flood: %v", took)
		cancel(floodToken, ids...)
	})

	t.Run("another client's run starts as a slot frees", func(t *testing.T) {
		var ids []string
		for range 2 {
			var created batchCreated
			if code := s.requestAs(floodToken, "POST", "/v1/batches", map[string]any{"runs": sleeps(1000, 0)}, &created); code != http.StatusCreated {
				t.Fatalf("a batch of 1000: %d", code)
			}
			ids = append(ids, created.BatchID)
		}
		defer cancel(floodToken, ids...)
		time.Sleep(2 * time.Second) // the slots are the flood's
		var took []time.Duration
		for range 3 {
			took = append(took, served())
		}
		t.Logf("another client's run, 2000 of one client's queued: %v", took)
		for _, d := range took {
			// A slot frees every half second (two slots, runs of 1 s); the
			// run is given at once and taken within two of them.
			if d > 8*time.Second {
				t.Errorf("another client's run took %v with one client's 2000 queued", d)
			}
		}
	})

	t.Run("a batch is held to its conversations and its tier", func(t *testing.T) {
		runs := sleeps(40, 0)
		for _, r := range runs {
			r["conversationId"] = "one"
		}
		var e struct{ Error, Message string }
		if code := s.requestAs(bystanderToken, "POST", "/v1/batches", map[string]any{"runs": runs}, &e); code != http.StatusTooManyRequests || e.Error != "busy" {
			t.Errorf("40 runs into one conversation: %d %+v", code, e)
		}
		runs = sleeps(12, 0)
		for _, r := range runs {
			r["timeout_seconds"] = 4
		}
		if code := s.requestAs(dayToken, "POST", "/v1/batches", map[string]any{"runs": runs}, &e); code != http.StatusTooManyRequests || e.Error != "quota_exceeded" {
			t.Errorf("12 runs of 4 s of 20 s a day: %d %+v", code, e)
		}
		var created batchCreated
		if code := s.requestAs(dayToken, "POST", "/v1/batches", map[string]any{"runs": runs[:5]}, &created); code != http.StatusCreated {
			t.Fatalf("5 runs of 4 s of 20 s a day: %d", code)
		}
		code, _ := s.restAs(dayToken, "POST", "/v1/runs", `{"language":"bash","code":"echo x"}`)
		if code != http.StatusTooManyRequests {
			t.Errorf("a run past what the batch reserved: %d", code)
		}
	})
}
