package audit

import (
	"context"
	"encoding/json"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/runbox-dev/runbox/internal/store"
	"github.com/runbox-dev/runbox/internal/store/auditlog"
	"github.com/runbox-dev/runbox/internal/testenv"
)

func sealed(t *testing.T, chain *Chain, n int) []Entry {
	t.Helper()
	var out []Entry
	prevSeq, prevHash := int64(0), ""
	for i := range n {
		e := Entry{Time: time.Unix(int64(1000+i), 0).UTC(), Call: "c", Phase: PhaseStart, Client: "alice", Tool: "run_code",
			Params: map[string]any{"n": float64(i)}}
		if err := chain.Seal(&e, prevSeq, prevHash); err != nil {
			t.Fatal(err)
		}
		prevSeq, prevHash = e.Seq, e.Hash
		out = append(out, e)
	}
	return out
}

func verify(chain *Chain, cp *Checkpoint, entries []Entry) error {
	v, err := chain.NewVerifier(cp)
	if err != nil {
		return err
	}
	for _, e := range entries {
		if err := v.Next(e); err != nil {
			return err
		}
	}
	return nil
}

func TestChainDetectsTampering(t *testing.T) {
	chain := NewChain([]byte("audit-key-0123456789"))
	entries := sealed(t, chain, 5)
	if err := verify(chain, nil, entries); err != nil {
		t.Fatalf("intact chain: %v", err)
	}
	tests := []struct {
		name   string
		tamper func([]Entry) []Entry
		want   string
	}{
		{"changed", func(es []Entry) []Entry { es[2].Client = "mallory"; return es }, "changed"},
		{"changed params", func(es []Entry) []Entry { es[1].Params = map[string]any{"n": float64(9)}; return es }, "changed"},
		{"removed", func(es []Entry) []Entry { return append(es[:2:2], es[3:]...) }, "removed or inserted"},
		{"inserted", func(es []Entry) []Entry {
			x := es[1]
			x.Seq++
			return append(append(es[:2:2], x), es[2:]...)
		}, ""},
		{"resealed with another key", func(es []Entry) []Entry {
			other := NewChain([]byte("not-the-key-0000000"))
			_ = other.Seal(&es[3], es[2].Seq, es[2].Hash)
			return es
		}, "changed"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			es := tt.tamper(append([]Entry(nil), entries...))
			err := verify(chain, nil, es)
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("verify = %v, want an error with %q", err, tt.want)
			}
		})
	}
	// From a checkpoint: the rest verifies; a forged checkpoint does not.
	cp := Checkpoint{Seq: entries[1].Seq, Hash: entries[1].Hash, Time: time.Now()}
	chain.SignCheckpoint(&cp)
	if err := verify(chain, &cp, entries[2:]); err != nil {
		t.Errorf("from a checkpoint: %v", err)
	}
	cp.Seq = 0
	if err := verify(chain, &cp, entries[2:]); err == nil {
		t.Error("a forged checkpoint verified")
	}
}

// TestSanitize: every argument that carries text is in the log as a
// digest only, whatever its tool, its name or its depth; names, ids and
// choices are kept, and numbers and booleans.
func TestSanitize(t *testing.T) {
	const marker = "sk-live-MARKER"
	got := Sanitize(map[string]any{
		// run_code, start_run, run_python
		"code": "print('" + marker + "')", "stdin": marker, "env": map[string]any{"API_KEY": marker},
		"packages": []any{"git+https://" + marker + "@example.com/x.git"},
		// execute_code, execute_code_async
		"command": "curl -H 'Authorization: " + marker + "' x", "environment": map[string]any{"TOKEN": marker},
		// send_stdin, both forms
		"data": marker, "input_data": marker,
		// upload_file, git, projects
		"content_base64": marker, "commit_message": marker, "pr_title": marker,
		// an argument no tool has yet, and text where a number belongs
		"future_field": marker, "port": marker, "nested": map[string]any{"a": marker},
		"sandbox_config": map[string]any{"network": map[string]any{"allowed_domains": []any{"pypi.org"}, "proxy": marker},
			"filesystem": map[string]any{"deny_read": []any{"/data/secret"}}},
		// kept
		"language": "python", "timeout_seconds": float64(5), "interactive": true,
		"conversationId": strings.Repeat("x", 1000), "execution_id": "run_0123", "secrets": []any{"openai_api_key"},
	})
	b, _ := json.Marshal(got)
	if strings.Contains(string(b), "MARKER") {
		t.Errorf("sanitized params show the marker: %s", b)
	}
	if got["language"] != "python" || got["timeout_seconds"] != float64(5) || got["interactive"] != true || got["execution_id"] != "run_0123" {
		t.Errorf("plain params: %s", b)
	}
	if c := got["conversationId"].(string); len(c) > maxParamString+len("…") {
		t.Errorf("a long name is kept whole: %d bytes", len(c))
	}
	if code, _ := got["code"].(map[string]any); code["len"] != len("print('"+marker+"')") || len(code["sha256"].(string)) != 64 {
		t.Errorf("code: %v", got["code"])
	}
	if env := got["environment"].(map[string]any); env["TOKEN"].(map[string]any)["len"] != len(marker) {
		t.Errorf("environment: the names stay, the values are digests: %v", env)
	}
	if s := got["secrets"].(map[string]any); s["count"] != 1 || s["secrets"].([]any)[0] != "openai_api_key" {
		t.Errorf("secrets: their names stay: %v", got["secrets"])
	}
	sc := got["sandbox_config"].(map[string]any)
	if d := sc["network"].(map[string]any)["allowed_domains"].(map[string]any); d["count"] != 1 || d["allowed_domains"].([]any)[0] != "pypi.org" {
		t.Errorf("sandbox_config: %s", b)
	}
}

// TestSanitizeFiles: files to be written keep their paths and sizes, and
// their contents only as digests, in either shape clients send them.
func TestSanitizeFiles(t *testing.T) {
	many := make([]any, 40)
	for i := range many {
		many[i] = "f" + strings.Repeat("x", i)
	}
	many[2] = map[string]any{"not": "secret-path"}
	got := Sanitize(map[string]any{
		"files": []any{
			map[string]any{"path": "report.md", "content": "secret report", "encoding": "utf-8"},
			map[string]any{"path": "b.bin", "content": "c2VjcmV0", "encoding": "base64", "mode": "secret-mode"},
			"secret-bare",
		},
		"initial_files": map[string]any{"a.js": "secret-js"},
		"paths":         many,
	})
	b, _ := json.Marshal(got)
	for _, secret := range []string{"secret report", "c2VjcmV0", "secret-mode", "secret-bare", "secret-js", "secret-path"} {
		if strings.Contains(string(b), secret) {
			t.Errorf("sanitized params show %q: %s", secret, b)
		}
	}
	files := got["files"].(map[string]any)
	list := files["files"].([]map[string]any)
	if files["count"] != 3 || len(list) != 3 || list[0]["path"] != "report.md" || list[0]["encoding"] != "utf-8" {
		t.Fatalf("files: %s", b)
	}
	if c := list[0]["content"].(map[string]any); c["len"] != len("secret report") || len(c["sha256"].(string)) != 64 {
		t.Errorf("content: %v", c)
	}
	paths := got["paths"].(map[string]any)
	if paths["count"] != 40 || len(paths["paths"].([]any)) != maxParamItems || paths["paths"].([]any)[1] != "fx" {
		t.Errorf("paths: %v", paths)
	}
	byMap := Sanitize(map[string]any{"files": map[string]any{"x/y.txt": "secret-y"}})["files"].(map[string]any)
	if e := byMap["files"].([]map[string]any)[0]; e["path"] != "x/y.txt" || e["content"].(map[string]any)["len"] != 8 {
		t.Errorf("files as a map: %v", byMap)
	}
}

// TestSealersShareOneChain: two replicas record at once while two sealers
// compete for the lease; every entry lands once, in one chain that
// verifies; retention leaves a checkpoint the rest verifies from.
func TestSealersShareOneChain(t *testing.T) {
	url := testenv.Redis(t)
	ctx := context.Background()
	chain := NewChain([]byte("audit-key-0123456789"))
	log := slog.New(slog.DiscardHandler)
	clock := clockwork.NewRealClock()
	var sealers []*Sealer
	for range 2 {
		st := auditlog.New(store.NewConn(testenv.Client(t, url)))
		s := NewSealer(st, chain, 0, clock, log)
		if err := s.Start(ctx); err != nil {
			t.Fatal(err)
		}
		sealers = append(sealers, s)
	}
	var wg sync.WaitGroup
	const perReplica = 200
	for r := range 2 {
		rec := NewRecorder(auditlog.New(store.NewConn(testenv.Client(t, url))), clock, log)
		wg.Go(func() {
			for i := range perReplica {
				c, err := rec.Begin(ctx, Entry{Client: "alice", Tool: "run_code", Params: Sanitize(map[string]any{"code": "x", "i": float64(i), "replica": float64(r)})})
				if err != nil {
					t.Error(err)
					return
				}
				c.End(ctx, "", "run_x")
			}
		})
	}
	wg.Wait()
	st := auditlog.New(store.NewConn(testenv.Client(t, url)))
	if err := sealers[0].SealAll(ctx, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	for _, s := range sealers {
		s.Stop()
	}
	raw, err := st.Entries(ctx, 0, -1)
	if err != nil {
		t.Fatal(err)
	}
	if len(raw) != 2*2*perReplica {
		t.Fatalf("%d entries sealed, want %d", len(raw), 4*perReplica)
	}
	var entries []Entry
	for _, r := range raw {
		var e Entry
		json.Unmarshal([]byte(r), &e)
		entries = append(entries, e)
	}
	if err := verify(chain, nil, entries); err != nil {
		t.Fatalf("chain: %v", err)
	}

	// Retention: everything before the middle goes, behind a checkpoint.
	mid := entries[len(entries)/2].Time
	fake := clockwork.NewFakeClockAt(mid.Add(time.Hour))
	trimmer := NewSealer(st, chain, time.Hour, fake, log)
	if held, _ := st.Lease(ctx, trimmer.holder, time.Minute); !held {
		t.Fatal("no lease")
	}
	if err := trimmer.Trim(ctx); err != nil {
		t.Fatal(err)
	}
	raw, _ = st.Entries(ctx, 0, -1)
	cpRaw, _ := st.Checkpoint(ctx)
	var cp Checkpoint
	if err := json.Unmarshal([]byte(cpRaw), &cp); err != nil || len(raw) >= len(entries) || len(raw) == 0 {
		t.Fatalf("after trim: %d entries, checkpoint %q", len(raw), cpRaw)
	}
	var rest []Entry
	for _, r := range raw {
		var e Entry
		json.Unmarshal([]byte(r), &e)
		rest = append(rest, e)
	}
	if err := verify(chain, &cp, rest); err != nil {
		t.Errorf("the rest from the checkpoint: %v", err)
	}
}

// BenchmarkRecord measures what recording costs a call: its two entries.
func BenchmarkRecord(b *testing.B) {
	url := testenv.Redis(b)
	ctx := context.Background()
	rec := NewRecorder(auditlog.New(store.NewConn(testenv.Client(b, url))), clockwork.NewRealClock(), slog.New(slog.DiscardHandler))
	params := Sanitize(map[string]any{"code": "print(1)", "language": "python", "conversationId": "bench"})
	for b.Loop() {
		c, err := rec.Begin(ctx, Entry{Client: "alice", Tool: "run_code", Params: params})
		if err != nil {
			b.Fatal(err)
		}
		c.End(ctx, "", "run_x")
	}
}
