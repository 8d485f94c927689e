package e2e

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
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
