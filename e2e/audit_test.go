package e2e

import (
	"bytes"
	"cmp"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/runbox-dev/runbox/internal/testenv"
)

const auditKey = "e2e-audit-key-0123456789"

// auditCmd runs `api audit …` with the service's configuration.
func (s *service) auditCmd(args ...string) (int, string, string) {
	s.t.Helper()
	cmd := exec.Command(bin.api, append([]string{"audit"}, args...)...)
	cmd.Env = s.env
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	err := cmd.Run()
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		s.t.Fatal(err)
	}
	return code, out.String(), errb.String()
}

type auditLine struct {
	Seq        int64          `json:"seq"`
	Phase      string         `json:"phase"`
	Client     string         `json:"client"`
	Tool       string         `json:"tool"`
	Route      string         `json:"route"`
	RunID      string         `json:"run_id"`
	Result     string         `json:"result"`
	Params     map[string]any `json:"params"`
	Checkpoint any            `json:"checkpoint"`
}

func TestAudit(t *testing.T) {
	s := start(t, options{env: []string{"AUDIT_KEY=" + auditKey, "MCP_API_TOKENS=alice:" + aliceToken}})
	alice := s.sessionAs(aliceToken)

	// A call that blocks is in the log, sealed, before it ends.
	done := make(chan result, 1)
	go func() {
		done <- runCode(t, alice, map[string]any{"language": "bash", "conversationId": "audited",
			"code": "sleep 3; echo secret-output", "env": map[string]any{"API_KEY": "sk-secret-value"}})
	}()
	found := false
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline) && !found; {
		code, out, errOut := s.auditCmd("export")
		if code != 0 {
			t.Fatalf("export: %d %s", code, errOut)
		}
		for _, l := range parseAudit(t, out) {
			if l.Tool == "run_code" && l.Phase == "start" && l.Client == "alice" {
				found = true
			}
		}
	}
	if !found {
		t.Error("the start of a running call was not in the log")
	}
	res := <-done
	if !res.Success {
		t.Fatalf("run: %+v", res)
	}
	// A REST request, a refused one, a rate-limited-free failure.
	s.restAs(aliceToken, "GET", "/v1/runs/"+res.RunID, "")
	s.restAs("wrong-token-0000000", "GET", "/v1/runners", "")
	call(t, alice, "get_run", map[string]any{"run_id": "run_000000000000000000000000"}, nil)

	code, out, errOut := s.auditCmd("export")
	if code != 0 {
		t.Fatalf("export: %d %s", code, errOut)
	}
	lines := parseAudit(t, out)
	var sawEnd, sawREST, sawDenied, sawFailure bool
	for _, l := range lines {
		switch {
		case l.Tool == "run_code" && l.Phase == "end" && l.Result == "success" && l.RunID == res.RunID:
			sawEnd = true
		case l.Route == "GET /v1/runs/:id" && l.Client == "alice":
			sawREST = true
		case l.Result == "denied":
			sawDenied = true
		case l.Tool == "get_run" && l.Result == "failure":
			sawFailure = true
		}
	}
	if !sawEnd || !sawREST || !sawDenied || !sawFailure {
		t.Errorf("log lacks entries: end %v, REST %v, denied %v, failure %v\n%s", sawEnd, sawREST, sawDenied, sawFailure, out)
	}
	for _, secret := range []string{"sk-secret-value", "secret-output", "sleep 3", aliceToken} {
		if strings.Contains(out, secret) {
			t.Errorf("the log holds %q in clear", secret)
		}
	}

	// The live log and the export verify.
	if code, _, errOut := s.auditCmd("verify"); code != 0 {
		t.Errorf("verify live: %d %s", code, errOut)
	}
	dir := t.TempDir()
	write := func(name string, lines []string) string {
		p := filepath.Join(dir, name)
		os.WriteFile(p, []byte(strings.Join(lines, "\n")+"\n"), 0o600)
		return p
	}
	raw := strings.Split(strings.TrimSpace(out), "\n")
	if code, _, errOut := s.auditCmd("verify", "--file", write("intact.jsonl", raw)); code != 0 {
		t.Fatalf("verify export: %d %s", code, errOut)
	}
	mid := len(raw) / 2
	changed := append([]string(nil), raw...)
	changed[mid] = strings.Replace(changed[mid], `"client":"alice"`, `"client":"bob"`, 1)
	if changed[mid] == raw[mid] {
		changed[mid] = strings.Replace(changed[mid], `"phase":"`, `"phase":"x`, 1)
	}
	removed := append(append([]string(nil), raw[:mid]...), raw[mid+1:]...)
	inserted := append(append(append([]string(nil), raw[:mid]...), raw[mid-1]), raw[mid:]...)
	for name, lines := range map[string][]string{"changed": changed, "removed": removed, "inserted": inserted} {
		code, _, errOut := s.auditCmd("verify", "--file", write(name+".jsonl", lines))
		if code != 1 || !strings.Contains(errOut, "line") {
			t.Errorf("verify %s export: exit %d, %s", name, code, errOut)
		}
	}
}

func parseAudit(t *testing.T, out string) []auditLine {
	t.Helper()
	var lines []auditLine
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		if l == "" {
			continue
		}
		var a auditLine
		if err := json.Unmarshal([]byte(l), &a); err != nil {
			t.Fatalf("export line %q: %v", l, err)
		}
		lines = append(lines, a)
	}
	return lines
}

// TestAuditArchive: past AUDIT_MAX_REDIS_ENTRIES the oldest entries leave
// Redis for the file store (the host folder, or S3); `audit verify` and
// `audit export` walk them and Redis as one chain, and a segment changed
// or missing in the store breaks it, named.
func TestAuditArchive(t *testing.T) {
	for _, store := range []string{"host", "s3"} {
		t.Run(store, func(t *testing.T) {
			s := start(t, options{s3: store == "s3", env: []string{"AUDIT_KEY=" + auditKey, "AUDIT_MAX_REDIS_ENTRIES=40"}})
			rdb := testenv.Client(t, s.redisURL)
			for range 60 {
				if code := s.request("GET", "/v1/runners", nil, nil); code != 200 {
					t.Fatalf("GET /v1/runners: %d", code)
				}
			}
			deadline := time.Now().Add(30 * time.Second)
			for rdb.LLen(context.Background(), "runbox:audit:segments").Val() < 2 {
				if time.Now().After(deadline) {
					t.Fatal("no segment was exported")
				}
				time.Sleep(100 * time.Millisecond)
			}
			// Between a seal and the export after it Redis may hold a few
			// more; with no more calls it comes back under the bound.
			for n := rdb.LLen(context.Background(), "runbox:audit:log").Val(); n > 40; n = rdb.LLen(context.Background(), "runbox:audit:log").Val() {
				if time.Now().After(deadline) {
					t.Fatalf("Redis holds %d sealed entries; the bound is 40", n)
				}
				time.Sleep(100 * time.Millisecond)
			}
			code, out, errOut := s.auditCmd("verify")
			if code != 0 || !strings.Contains(out, "entries verified") {
				t.Fatalf("verify: %d %s %s", code, out, errOut)
			}
			var verified int
			fmt.Sscanf(out, "audit: %d entries verified", &verified)
			if verified < 120 {
				t.Errorf("verified %d entries, want the 120 of 60 calls at least", verified)
			}
			code, exported, errOut := s.auditCmd("export")
			if code != 0 || len(parseAudit(t, exported)) < 120 {
				t.Fatalf("export: %d, %d lines, %s", code, len(parseAudit(t, exported)), errOut)
			}
			if store != "host" {
				return
			}
			segs, _ := filepath.Glob(filepath.Join(s.root, ".audit", "audit-*.jsonl"))
			if len(segs) < 2 {
				t.Fatalf("segments in SANDBOX_ROOT/.audit: %v", segs)
			}
			orig, _ := os.ReadFile(segs[0])
			os.WriteFile(segs[0], bytes.Replace(orig, []byte(`"client":"default"`), []byte(`"client":"mallory"`), 1), 0o600)
			if code, _, errOut := s.auditCmd("verify"); code != 1 || !strings.Contains(errOut, filepath.Base(segs[0])) {
				t.Errorf("verify with a changed segment: %d %s", code, errOut)
			}
			os.Remove(segs[0])
			if code, _, errOut := s.auditCmd("verify"); code != 1 || !strings.Contains(errOut, "missing") {
				t.Errorf("verify with a missing segment: %d %s", code, errOut)
			}
			os.WriteFile(segs[0], orig, 0o600)
			if code, _, errOut := s.auditCmd("verify"); code != 0 {
				t.Errorf("verify with the segment back: %d %s", code, errOut)
			}
		})
	}
}

// TestAuditKeepsNoSecret calls every tool that takes text (code, a
// command, input, environment values, file contents, a commit message),
// a tool that does not exist and REST routes, each with one marker, then
// reads the whole audit log (the export, every audit key in Redis and
// the archive's segments): the marker is nowhere, while the calls and
// their variables' names are.
func TestAuditKeepsNoSecret(t *testing.T) {
	// 24 characters of base64's alphabet: valid file content as it is.
	marker := "AuditMarker7" + strings.ToUpper(hex.EncodeToString([]byte(rand.Text())[:6]))
	repos := testenv.WriteFile(t, "repos.yaml", fmt.Sprintf(`
author: {name: runbox e2e, email: e2e@example.com}
repos:
  reports:
    forge: gitea
    url: http://127.0.0.1:%d/owner/reports.git
    token: forge-token-0123456789
    allowed_branches: ["runbox/*"]
    clients: [default]
`, testenv.FreePort(t)))
	// A small bound in Redis: older entries go to the archive, read too.
	s := start(t, options{env: []string{"AUDIT_KEY=" + auditKey, "GIT_REPOS_FILE=" + repos, "AUDIT_MAX_REDIS_ENTRIES=10"}})
	cs := s.session(nil)
	ctx := context.Background()

	env := map[string]any{"API_KEY": marker}
	var started struct {
		RunID string `json:"run_id"`
	}
	call(t, cs, "start_run", map[string]any{"language": "bash", "conversationId": "secrets", "interactive": true,
		"code": "read x; echo \"$x\" # " + marker, "env": env}, &started)
	var async struct {
		ExecutionID string `json:"execution_id"`
	}
	call(t, cs, "execute_code_async", map[string]any{"command": "read x # " + marker, "interactive": true, "environment": env}, &async)
	calls := []struct {
		tool string
		args map[string]any
	}{
		{"run_code", map[string]any{"language": "bash", "conversationId": "secrets", "code": "echo " + marker,
			"stdin": marker, "env": env, "packages": []string{"git+https://" + marker + "@example.com/x.git"}}},
		{"run_python", map[string]any{"session_id": "secrets-py", "code": "print('" + marker + "')"}},
		{"send_stdin", map[string]any{"run_id": started.RunID, "data": marker + "\n", "eof": true}},
		{"execute_code", map[string]any{"command": "echo " + marker, "environment": env}},
		{"send_stdin", map[string]any{"execution_id": async.ExecutionID, "input_data": marker}},
		{"upload_file", map[string]any{"conversationId": "secrets", "filename": "m.txt", "content_base64": marker}},
		{"create_sandbox_for_project", map[string]any{"project_name": "p", "template": "no-such-template",
			"initial_files": map[string]any{"index.js": marker}}},
		{"write_files_to_sandbox", map[string]any{"sandbox_id": "00000000-0000-4000-8000-000000000000",
			"files": map[string]any{"a.js": marker}}},
		{"commit_and_push_to_github", map[string]any{"repo_id": "reports", "branch": "runbox/x",
			"files": []any{map[string]any{"path": "a.md", "content": marker}}, "commit_message": marker, "pr_title": marker,
			"create_pr": true}},
		{"a_tool_no_one_has_made_yet", map[string]any{"secret": marker}},
	}
	for _, c := range calls {
		// Whether the call succeeds does not matter: it is recorded
		// before it runs.
		_, _ = cs.CallTool(ctx, &mcp.CallToolParams{Name: c.tool, Arguments: c.args})
	}
	s.request("POST", "/v1/runs?conversationId=secrets&note="+marker, map[string]any{"language": "bash", "code": "echo " + marker}, nil)
	s.restAs(token, "PUT", "/v1/conversations/secrets/files/r.txt?note="+marker, marker)

	code, out, errOut := s.auditCmd("export")
	if code != 0 {
		t.Fatalf("export: %d %s", code, errOut)
	}
	seen := map[string]bool{}
	for _, l := range parseAudit(t, out) {
		seen[cmp.Or(l.Tool, l.Route)] = true
	}
	for _, c := range calls {
		if !seen[c.tool] {
			t.Errorf("no entry of %s", c.tool)
		}
	}
	if !seen["POST /v1/runs"] || !strings.Contains(out, `"API_KEY"`) {
		t.Errorf("the log lacks the REST request or the variables' names:\n%s", out)
	}
	if strings.Contains(out, marker) {
		t.Errorf("the export holds the marker:\n%s", out)
	}
	// Everything Redis keeps of the log, raw and sealed.
	rdb := testenv.Client(t, s.redisURL)
	keys, err := rdb.Keys(ctx, "runbox:audit*").Result()
	if err != nil || len(keys) == 0 {
		t.Fatalf("audit keys: %v %v", keys, err)
	}
	for _, k := range keys {
		var dump string
		switch typ := rdb.Type(ctx, k).Val(); typ {
		case "stream":
			dump = fmt.Sprint(rdb.XRange(ctx, k, "-", "+").Val())
		case "list":
			dump = fmt.Sprint(rdb.LRange(ctx, k, 0, -1).Val())
		case "hash":
			dump = fmt.Sprint(rdb.HGetAll(ctx, k).Val())
		case "string":
			dump = rdb.Get(ctx, k).Val()
		case "zset":
			dump = fmt.Sprint(rdb.ZRange(ctx, k, 0, -1).Val())
		case "set":
			dump = fmt.Sprint(rdb.SMembers(ctx, k).Val())
		default:
			t.Errorf("%s is a %s this test does not read", k, typ)
		}
		if strings.Contains(dump, marker) {
			t.Errorf("%s holds the marker", k)
		}
	}
	// And what left Redis for the archive (SANDBOX_ROOT/.audit).
	for deadline := time.Now().Add(30 * time.Second); rdb.LLen(ctx, "runbox:audit:segments").Val() < 1; time.Sleep(100 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("no segment was archived")
		}
	}
	segs, _ := filepath.Glob(filepath.Join(s.root, ".audit", "*"))
	if len(segs) == 0 {
		t.Fatal("no segment in SANDBOX_ROOT/.audit")
	}
	for _, seg := range segs {
		if b, err := os.ReadFile(seg); err != nil || bytes.Contains(b, []byte(marker)) {
			t.Errorf("segment %s: holds the marker, or %v", filepath.Base(seg), err)
		}
	}
	if code, _, errOut := s.auditCmd("verify"); code != 0 {
		t.Errorf("verify: %d %s", code, errOut)
	}
}
