package e2e

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/runbox-dev/runbox/internal/testenv"
)

// The floods of issue 32: nobody outside, and no sandboxed program, can
// make Redis grow without bound. Each test measures Redis (used_memory,
// and the audit log's entries) around a flood against the real api,
// executor and redis-server. They run a few thousand requests; with
// E2E_FLOOD_FULL=1 they run the sizes (30,000 refused requests,
// 20,000 refused connections).

func floodSize(small, full int) int {
	if os.Getenv("E2E_FLOOD_FULL") != "" {
		return full
	}
	return small
}

// redisUsed returns Redis's used_memory.
func redisUsed(t *testing.T, rdb *redis.Client) int64 {
	t.Helper()
	info, err := rdb.InfoMap(context.Background(), "memory").Result()
	if err != nil {
		t.Fatal(err)
	}
	n, err := strconv.ParseInt(info["Memory"]["used_memory"], 10, 64)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

// auditEntries counts the audit log's entries in Redis: raw and sealed.
// callDuring makes valid calls (GET /v1/runners, 20 a second at most)
// until the function it returns is called; that returns how many were
// made. A call that fails fails the test.
func callDuring(t *testing.T, s *service) func() int {
	made := make(chan int, 1)
	stop := make(chan struct{})
	go func() {
		n := 0
		defer func() { made <- n }()
		for {
			select {
			case <-stop:
				return
			default:
			}
			if code := s.request("GET", "/v1/runners", nil, nil); code != http.StatusOK {
				t.Errorf("a valid call during the flood: %d", code)
				return
			}
			n++
			time.Sleep(50 * time.Millisecond)
		}
	}()
	return func() int {
		close(stop)
		return <-made
	}
}

func auditEntries(rdb *redis.Client) int64 {
	ctx := context.Background()
	return rdb.XLen(ctx, "runbox:audit:raw").Val() + rdb.LLen(ctx, "runbox:audit:log").Val()
}

// TestRefusedRequestFlood: requests with a wrong token, on every route
// that asks for one and from several source addresses, cost Redis a
// bounded size (two audit entries per source and minute, not per
// request); the sources past their budget are answered 429; valid calls
// keep working during and after; the refusals show in the audit log and
// the metrics.
func TestRefusedRequestFlood(t *testing.T) {
	s := start(t, options{env: []string{"AUDIT_KEY=" + auditKey}})
	rdb := testenv.Client(t, s.redisURL)
	// Let the start settle (the sealer, the executor's first writes).
	time.Sleep(2 * time.Second)
	before, beforeEntries := redisUsed(t, rdb), auditEntries(rdb)

	routes := []struct{ method, path, body string }{
		{"POST", "/mcp", `{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"run_code"}}`},
		{"GET", "/mcp/events", ""},
		{"POST", "/mcp/events?sessionid=AAAAAAAAAAAAAAAAAAAAAAAAAA", `{"jsonrpc":"2.0","id":1,"method":"ping"}`},
		{"GET", "/v1/runners", ""},
		{"POST", "/v1/runs", `{"language":"python","code":"print(1)"}`},
		{"GET", "/monitoring/", ""},
		{"GET", "/files/flood/x.txt?exp=9999999999&sig=00", ""},
	}
	const sources = 8
	total := floodSize(3000, 30000)
	var answers sync.Map // status → *atomic.Int64
	count := func(code int) {
		v, _ := answers.LoadOrStore(code, new(atomic.Int64))
		v.(*atomic.Int64).Add(1)
	}
	var next atomic.Int64
	var wg sync.WaitGroup
	for src := range sources {
		// Each worker sends from an address of its own on loopback.
		local := &net.TCPAddr{IP: net.IPv4(127, 0, 0, byte(10+src))}
		client := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{
			DialContext:         (&net.Dialer{LocalAddr: local}).DialContext,
			MaxIdleConnsPerHost: 4,
		}}
		wg.Go(func() {
			for i := next.Add(1); i <= int64(total); i = next.Add(1) {
				r := routes[int(i)%len(routes)]
				req, _ := http.NewRequest(r.method, s.url+r.path, strings.NewReader(r.body))
				req.Header.Set("Authorization", "Bearer wrong-token-"+strconv.Itoa(int(i)))
				req.Header.Set("Content-Type", "application/json")
				resp, err := client.Do(req)
				if err != nil {
					t.Error(err)
					return
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				count(resp.StatusCode)
			}
		})
	}
	// A client with a valid token, during the flood: each of its calls is
	// audited (two entries).
	validCalls := callDuring(t, s)
	began := time.Now()
	wg.Wait()
	took := time.Since(began)
	valid := validCalls()
	if valid == 0 {
		t.Error("no valid call was made during the flood")
	}
	statuses := map[int]int64{}
	answers.Range(func(k, v any) bool { statuses[k.(int)] = v.(*atomic.Int64).Load(); return true })
	// The sealer moves entries from the raw stream to the log; count both.
	time.Sleep(2 * time.Second)
	grew, entries := redisUsed(t, rdb)-before, auditEntries(rdb)-beforeEntries
	t.Logf("%d refused requests from %d sources in %v (and %d valid calls): answers %v; Redis grew by %d bytes, the audit log by %d entries",
		total, sources, took.Round(time.Millisecond), valid, statuses, grew, entries)
	if statuses[http.StatusTooManyRequests] == 0 {
		t.Errorf("no source was answered 429: %v", statuses)
	}
	if bad := statuses[http.StatusOK] + statuses[http.StatusInternalServerError]; bad != 0 {
		t.Errorf("answers %v", statuses)
	}
	if entries -= 2 * int64(valid); entries > 2*sources*int64(took/time.Minute+2) {
		t.Errorf("%d refused requests wrote %d audit entries", total, entries)
	}
	if grew > 4<<20 {
		t.Errorf("%d refused requests grew Redis by %d bytes (bound: 4 MB)", total, grew)
	}

	// After: a run works; the metrics count the refusals.
	cs := s.session(nil)
	if r := runCode(t, cs, map[string]any{"language": "bash", "code": "echo after"}); !r.Success || r.Stdout != "after\n" {
		t.Errorf("a run after the flood: %+v", r)
	}
	status, body := get(t, s.url+"/metrics")
	if status != http.StatusOK || !strings.Contains(string(body), `runbox_refused_requests_total{answer="rate_limited"}`) {
		t.Errorf("metrics: %d, no refusal counter", status)
	}
}

// TestEgressFlood: a program opening thousands of refused connections
// through the egress proxy costs Redis a bounded size — its first
// connections one by one, the rest counted per host and reason in its
// events, its result and the audit log — and its run still ends with a
// result while valid calls keep working; over the proxy socket and over
// the agent's streams alike.
func TestEgressFlood(t *testing.T) {
	w := newWorld(t)
	n := floodSize(3000, 20000)
	for _, path := range []string{"socket", "streams"} {
		t.Run(path, func(t *testing.T) {
			env := append(w.env(), "SANDBOX_EGRESS_MAX_CONNECTIONS=100000", "SANDBOX_EXEC_TIMEOUT=300s")
			if path == "streams" {
				// A SANDBOX_ROOT too long for a Unix socket's path: proxy
				// connections go as streams of the agent's protocol.
				long := filepath.Join(t.TempDir(), strings.Repeat("r", 90))
				if err := os.MkdirAll(long, 0o755); err != nil {
					t.Fatal(err)
				}
				env = append(env, "SANDBOX_ROOT="+long, "SANDBOX_QUOTA_MODE=walk")
			}
			s := start(t, options{env: env})
			rdb := testenv.Client(t, s.redisURL)
			cs := s.session(nil)
			// A first run makes the conversation's sandbox; the flood's
			// run then finds it warm.
			runEgress(t, cs, map[string]any{"language": "python", "conversationId": "flood", "code": "print(1)",
				"network": map[string]any{"allowed_domains": []string{"files.test"}}})
			time.Sleep(2 * time.Second)
			before, beforeEntries := redisUsed(t, rdb), auditEntries(rdb)
			code := fmt.Sprintf(`import socket
refused = 0
for i in range(%d):
    s = socket.create_connection(("127.0.0.1", 3128))
    host = "denied%%d.test" %% (i %% 3)
    s.sendall(("GET http://%%s/ HTTP/1.1\r\nHost: %%s\r\n\r\n" %% (host, host)).encode())
    if b"403" in s.recv(200):
        refused += 1
    s.close()
print(refused)`, n)
			// A valid call during the flood, as in TestRefusedRequestFlood.
			validCalls := callDuring(t, s)
			began := time.Now()
			r := runEgress(t, cs, map[string]any{"language": "python", "conversationId": "flood", "code": code,
				"timeout_seconds": 240, "network": map[string]any{"allowed_domains": []string{"files.test"}}})
			took := time.Since(began)
			calls := validCalls()
			if calls == 0 {
				t.Error("no valid call was made during the flood")
			}
			time.Sleep(2 * time.Second)
			grew, entries := redisUsed(t, rdb)-before, auditEntries(rdb)-beforeEntries
			t.Logf("%d refused connections (%s) in %v: Redis grew by %d bytes, the audit log by %d entries; the result lists %d",
				n, path, took.Round(time.Millisecond), grew, entries, len(r.Egress))
			if !r.Success || strings.TrimSpace(r.Stdout) != strconv.Itoa(n) {
				t.Fatalf("the flood's run: success %v, stdout %q, stderr %q", r.Success, r.Stdout, r.Stderr)
			}
			counted := 0
			for _, e := range r.Egress {
				if e.Allowed {
					t.Errorf("allowed: %+v", e)
				}
				counted += max(e.Count, 1)
			}
			if counted != n || len(r.Egress) > 1000+64+1 {
				t.Errorf("the result lists %d entries standing for %d connections; want at most 1065 for %d", len(r.Egress), counted, n)
			}
			// Each valid call made meanwhile is audited too, its start and
			// its end; the rest is the flood's bound (1000 records, 64
			// counts) and the runs' own entries. An entry per connection
			// would be 3000.
			if entries-2*int64(calls) > 1000+64+40 {
				t.Errorf("%d refused connections wrote %d audit entries (%d valid calls meanwhile)", n, entries, calls)
			}
			if grew > 4<<20 {
				t.Errorf("%d refused connections grew Redis by %d bytes (bound: 4 MB)", n, grew)
			}
			if r := runCode(t, cs, map[string]any{"language": "bash", "code": "echo after"}); !r.Success || r.Stdout != "after\n" {
				t.Errorf("a run after the flood: %+v", r)
			}
		})
	}
}
