package e2e

import (
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/runbox-dev/runbox/internal/testenv"
)

// zeros is a body of n zero bytes, made as it is read.
type zeros struct{ left int64 }

func (z *zeros) Read(p []byte) (int, error) {
	if z.left == 0 {
		return 0, io.EOF
	}
	n := int(min(int64(len(p)), z.left))
	clear(p[:n])
	z.left -= int64(n)
	return n, nil
}

// rss returns the resident memory of a process, in bytes.
func rss(t *testing.T, pid int) int64 {
	t.Helper()
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, _ := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			return kb << 10
		}
	}
	t.Fatal("no VmRSS")
	return 0
}

// TestOversizedBodyRefusedUnread sends 90 MB bodies that declare their
// length to every body-taking endpoint, with and without a token: each is
// refused with 413 before it is read, and the api's memory does not follow
// the request.
func TestOversizedBodyRefusedUnread(t *testing.T) {
	s := start(t, options{})
	var api *proc
	for _, p := range s.procs {
		if p.name == "api" {
			api = p
		}
	}
	before := rss(t, api.cmd.Process.Pid)
	for _, path := range []string{"/mcp", "/mcp/events?sessionid=x", "/v1/runs", "/v1/conversations/c/files/big.bin"} {
		for _, tok := range []string{token, ""} {
			method := http.MethodPost
			if strings.Contains(path, "/files/") {
				method = http.MethodPut
			}
			req, _ := http.NewRequest(method, s.url+path, &zeros{left: 90 << 20})
			req.ContentLength = 90 << 20
			req.Header.Set("Content-Type", "application/json")
			if tok != "" {
				req.Header.Set("Authorization", "Bearer "+tok)
			}
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				// The server may close the connection while the client is
				// still sending; that is a refusal too.
				continue
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusRequestEntityTooLarge {
				t.Errorf("%s %s (token %v): status %d, want 413", method, path, tok != "", resp.StatusCode)
			}
		}
	}
	if growth := rss(t, api.cmd.Process.Pid) - before; growth > 16<<20 {
		t.Errorf("api RSS grew by %d MB for refused bodies, want ≤ 16 MB", growth>>20)
	}
}

// TestRedisPerRun: what a run with full output costs in Redis is bounded
// by a small multiple of the output it keeps (the result is stored once,
// events are capped).
func TestRedisPerRun(t *testing.T) {
	s := start(t, options{})
	cs := s.session(nil)
	rdb := testenv.Client(t, s.redisURL)
	used := func() int64 { return redisUsed(t, rdb) }
	// Flushed a line at a time, more than either stream keeps.
	code := "import sys\nfor i in range(5000):\n    print('o' * 49, flush=True)\n    print('e' * 49, file=sys.stderr, flush=True)"
	runCode(t, cs, map[string]any{"language": "python", "conversationId": "mem", "code": "print(1)"})
	before := used()
	const runs = 5
	kept := 0
	for range runs {
		res := runCode(t, cs, map[string]any{"language": "python", "conversationId": "mem", "code": code})
		if !res.StdoutTruncated {
			t.Fatalf("output not truncated: %d bytes", len(res.Stdout))
		}
		kept = len(res.Stdout) + len(res.Stderr)
	}
	growth := (used() - before) / runs
	t.Logf("Redis grew %d bytes per run keeping %d bytes of output (%.1f×)", growth, kept, float64(growth)/float64(kept))
	if growth > 4*int64(kept) {
		t.Errorf("Redis grew %d bytes per run for %d bytes of kept output, want ≤ 4×", growth, kept)
	}
}
