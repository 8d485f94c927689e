package e2e

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// forks is fork_conversation's result.
type forks struct {
	Conversations []struct {
		ConversationID string `json:"conversationId"`
	} `json:"conversations"`
	ForkedFrom     string `json:"forked_from"`
	Files          int    `json:"files"`
	SizeBytes      int64  `json:"size_bytes"`
	PackagesForked bool   `json:"packages_forked"`
	StateForked    bool   `json:"state_forked"`
	Note           string `json:"note"`
}

func fork(t *testing.T, cs *mcp.ClientSession, args map[string]any) (forks, string) {
	t.Helper()
	var f forks
	res := call(t, cs, "fork_conversation", args, &f)
	code, _ := toolErrorOf(res)
	return f, code
}

func fileNames(t *testing.T, cs *mcp.ClientSession, cid string) string {
	t.Helper()
	var list struct {
		Files []fileInfo `json:"files"`
	}
	if res := call(t, cs, "list_files", map[string]any{"conversationId": cid}, &list); res.IsError {
		t.Fatalf("list_files %s: %s", cid, text(res))
	}
	var names []string
	for _, f := range list.Files {
		names = append(names, f.Name)
	}
	return strings.Join(names, " ")
}

const (
	forkerToken = "forker-token-0123456789"
	otherToken  = "other-token-0123456789"
	meterToken  = "meter-token-0123456789"
)

// TestFork: a fork has its source's files, installed packages and kept
// state (the source's running interpreter is paused for it, and both
// restore it), and the two go their own ways; count makes several; ids
// taken, other clients' conversations and busy ones are refused, and so
// are forks past the client's storage or new conversations an hour,
// before anything is copied.
func TestFork(t *testing.T) {
	w := newWorld(t)
	clientsFile := filepath.Join(t.TempDir(), "clients.yaml")
	os.WriteFile(clientsFile, []byte(`
tiers:
  metered: {new_conversations_per_hour: 3, storage_bytes: 5000000}
clients:
  - {name: meter, token: `+meterToken+`, tier: metered}
`), 0o600)
	s := start(t, options{env: append(w.env(),
		"MCP_API_TOKENS=forker:"+forkerToken+",other:"+otherToken, "CLIENTS_FILE="+clientsFile)})
	cs := s.sessionAs(forkerToken)

	r := runEgress(t, cs, map[string]any{"language": "python", "conversationId": "src", "packages": []string{"tinypkg==0.1.0"},
		"code": "open('/data/notes.txt', 'w').write('v1')\nimport tinypkg\nprint(tinypkg.X)"})
	if !r.Success || r.Stdout != "42\n" {
		t.Fatalf("source run: %+v", r)
	}
	// The source's kept interpreter runs when it is forked.
	if r := keptCell(t, cs, "src", "import tinypkg\nhist = ['src']\nbig = bytes(5_000_000)\nlen(hist)"); r.Stdout != "1\n" {
		t.Fatalf("source's kept cell: %+v", r)
	}

	t.Run("files, packages and state", func(t *testing.T) {
		begin := time.Now()
		f, code := fork(t, cs, map[string]any{"conversationId": "src", "new_conversation_id": "try-a"})
		t.Logf("fork with a running kept interpreter (5 MB): %v", time.Since(begin))
		if code != "" || len(f.Conversations) != 1 || f.Conversations[0].ConversationID != "try-a" || f.ForkedFrom != "src" ||
			!f.PackagesForked || !f.StateForked || f.Files < 2 || f.Note != "" || f.SizeBytes < 5_000_000 {
			t.Fatalf("fork: %+v, %s", f, code)
		}
		// No packages asked: the fork imports the copy, and the source's file is there.
		r := runEgress(t, cs, map[string]any{"language": "python", "conversationId": "try-a",
			"code": "import tinypkg\nprint(tinypkg.X, open('/data/notes.txt').read())"})
		if r.Stdout != "42 v1\n" || len(r.Egress) != 0 {
			t.Errorf("run in the fork: %+v", r)
		}
		// Its first kept-state cell has the source's variables.
		if r := keptCell(t, cs, "try-a", "hist.append('fork')\nprint(hist, len(big), tinypkg.X)"); r.Stdout != "['src', 'fork'] 5000000 42\n" || !r.StateRestored || r.StateLost {
			t.Errorf("the fork's first kept cell: %+v", r)
		}
		// So has the source's: it was paused for the fork, not lost.
		if r := keptCell(t, cs, "src", "hist.append('source')\nprint(hist)"); r.Stdout != "['src', 'source']\n" || !r.StateRestored || r.StateLost {
			t.Errorf("the source's kept cell after the fork: %+v", r)
		}
		// From then on each has its own.
		if r := keptCell(t, cs, "try-a", "print(hist)"); r.Stdout != "['src', 'fork']\n" || r.StateRestored {
			t.Errorf("the fork's state after the source's cell: %+v", r)
		}
		if r := keptCell(t, cs, "src", "print(hist)"); r.Stdout != "['src', 'source']\n" || r.StateRestored {
			t.Errorf("the source's state after the fork's cell: %+v", r)
		}
	})

	t.Run("they diverge", func(t *testing.T) {
		runCode(t, cs, map[string]any{"language": "python", "conversationId": "try-a",
			"code": "open('/data/notes.txt', 'w').write('fork')\nopen('/data/fork-only.txt', 'w').write('x')"})
		runCode(t, cs, map[string]any{"language": "python", "conversationId": "src",
			"code": "open('/data/source-only.txt', 'w').write('x')"})
		r := runCode(t, cs, map[string]any{"language": "python", "conversationId": "src", "code": "print(open('/data/notes.txt').read())"})
		if r.Stdout != "v1\n" {
			t.Errorf("a write in the fork changed the source: %q", r.Stdout)
		}
		if got := fileNames(t, cs, "src"); got != "notes.txt source-only.txt" {
			t.Errorf("source's files: %q", got)
		}
		if got := fileNames(t, cs, "try-a"); got != "fork-only.txt notes.txt" {
			t.Errorf("fork's files: %q", got)
		}
	})

	t.Run("count 3 over REST", func(t *testing.T) {
		var f forks
		code := s.requestAs(forkerToken, "POST", "/v1/conversations/src/fork", map[string]any{"count": 3}, &f)
		if code != 201 || len(f.Conversations) != 3 {
			t.Fatalf("POST fork count 3: %d %+v", code, f)
		}
		seen := map[string]bool{}
		for _, c := range f.Conversations {
			seen[c.ConversationID] = true
			if got := fileNames(t, cs, c.ConversationID); got != "notes.txt source-only.txt" {
				t.Errorf("fork %s: %q", c.ConversationID, got)
			}
		}
		if len(seen) != 3 || !f.StateForked {
			t.Errorf("three forks, ids %v, state forked %v", seen, f.StateForked)
		}
		for id := range seen {
			if r := keptCell(t, cs, id, "print(hist)"); r.Stdout != "['src', 'source']\n" || !r.StateRestored {
				t.Errorf("fork %s's kept cell: %+v", id, r)
			}
		}
	})

	t.Run("refusals", func(t *testing.T) {
		tests := []struct {
			name string
			cs   *mcp.ClientSession
			args map[string]any
			code string
		}{
			{"an id in use", cs, map[string]any{"conversationId": "src", "new_conversation_id": "try-a"}, "conversation_exists"},
			{"an invalid id", cs, map[string]any{"conversationId": "src", "new_conversation_id": "../x"}, "invalid_argument"},
			{"more than 10", cs, map[string]any{"conversationId": "src", "count": 11}, "invalid_argument"},
			{"an unknown source", cs, map[string]any{"conversationId": "never"}, "not_found"},
			{"another client's", s.sessionAs(otherToken), map[string]any{"conversationId": "src"}, "not_found"},
		}
		for _, tt := range tests {
			if _, code := fork(t, tt.cs, tt.args); code != tt.code {
				t.Errorf("%s: %q, want %q", tt.name, code, tt.code)
			}
		}
		if code := s.requestAs(otherToken, "POST", "/v1/conversations/src/fork", map[string]any{}, nil); code != 404 {
			t.Errorf("REST fork of another client's conversation: %d", code)
		}
		if code := s.requestAs(forkerToken, "POST", "/v1/conversations/src/fork", map[string]any{"new_conversation_id": "try-a"}, nil); code != 409 {
			t.Errorf("REST fork onto an id in use: %d", code)
		}
	})

	t.Run("busy", func(t *testing.T) {
		var started struct {
			RunID string `json:"run_id"`
		}
		if res := call(t, cs, "start_run", map[string]any{"language": "bash", "conversationId": "src", "code": "sleep 30"}, &started); res.IsError {
			t.Fatal(text(res))
		}
		if _, code := fork(t, cs, map[string]any{"conversationId": "src", "new_conversation_id": "while-busy"}); code != "busy" {
			t.Errorf("fork of a conversation with a run: %q", code)
		}
		call(t, cs, "cancel_run", map[string]any{"run_id": started.RunID}, nil)
		if _, err := os.Stat(filepath.Join(s.root, "~forker~while-busy")); err == nil {
			t.Error("a refused fork made a folder")
		}
	})

	t.Run("audit", func(t *testing.T) {
		code, out, errOut := s.auditCmd("export")
		if code != 0 {
			t.Fatalf("audit export: %d %s", code, errOut)
		}
		found := false
		for _, l := range parseAudit(t, out) {
			if l.Tool == "fork_conversation" && l.Client == "forker" && l.Params["new_conversation_id"] == "try-a" &&
				l.Params["conversationId"] == "src" {
				found = true
			}
		}
		if !found {
			t.Error("no audit entry names the fork and its source")
		}
	})

	t.Run("limits", func(t *testing.T) {
		meter := s.sessionAs(meterToken)
		if code, _ := s.restAs(meterToken, "PUT", "/v1/conversations/big/files/big.bin", strings.Repeat("x", 2_000_000)); code != 201 {
			t.Fatalf("upload: %d", code)
		}
		// Two forks of 2 MB and the source pass 5 MB.
		if _, code := fork(t, meter, map[string]any{"conversationId": "big", "count": 2}); code != "quota_exceeded" {
			t.Errorf("forks past the storage: %q", code)
		}
		if _, code := fork(t, meter, map[string]any{"conversationId": "big"}); code != "" {
			t.Errorf("a fork within the limits: %q", code)
		}
		// The third new conversation of the hour; a fork of it is the fourth.
		if code, _ := s.restAs(meterToken, "PUT", "/v1/conversations/small/files/a.txt", "x"); code != 201 {
			t.Fatalf("upload: %d", code)
		}
		res := call(t, meter, "fork_conversation", map[string]any{"conversationId": "small"}, nil)
		if code, retry := toolErrorOf(res); code != "rate_limited" || retry <= 0 {
			t.Errorf("a fork past the hour: %q, retry %d", code, retry)
		}
		entries, _ := os.ReadDir(s.root)
		n := 0
		for _, e := range entries {
			if strings.HasPrefix(e.Name(), "~meter~") {
				n++
			}
		}
		if n != 3 {
			t.Errorf("meter has %d folders, want 3 (refused forks copy nothing)", n)
		}
	})
}

// TestForkS3: with FILE_STORE in a real S3 server the fork is made in the
// bucket by server-side copies; a run of the fork, on any executor, finds
// the source's files and kept state (saved to the bucket, re-sealed there
// for the fork), and the two diverge. Installed packages are not in the
// bucket, and the result says so.
func TestForkS3(t *testing.T) {
	s := start(t, options{s3: true})
	cs := s.session(nil)
	if code, _ := s.restAs(token, "PUT", "/v1/conversations/s3-src/files/in.txt", "hello"); code != 201 {
		t.Fatalf("upload: %d", code)
	}
	runCode(t, cs, map[string]any{"language": "python", "conversationId": "s3-src", "code": "open('out.txt', 'w').write('run')"})
	if r := keptCell(t, cs, "s3-src", "n = 41\nn"); r.Stdout != "41\n" {
		t.Fatalf("source's kept cell: %+v", r)
	}

	f, code := fork(t, cs, map[string]any{"conversationId": "s3-src", "new_conversation_id": "s3-fork"})
	if code != "" || f.Files != 2 || f.PackagesForked || !f.StateForked || !strings.Contains(f.Note, "packages") {
		t.Fatalf("fork: %+v, %q", f, code)
	}
	if r := keptCell(t, cs, "s3-fork", "n += 1\nn"); r.Stdout != "42\n" || !r.StateRestored {
		t.Errorf("the fork's first kept cell: %+v", r)
	}
	if r := keptCell(t, cs, "s3-src", "n -= 1\nn"); r.Stdout != "40\n" || !r.StateRestored {
		t.Errorf("the source's kept cell after the fork: %+v", r)
	}
	if r := keptCell(t, cs, "s3-fork", "n"); r.Stdout != "42\n" || r.StateRestored {
		t.Errorf("the fork's state after the source's cell: %+v", r)
	}
	r := runCode(t, cs, map[string]any{"language": "python", "conversationId": "s3-fork",
		"code": "print(open('in.txt').read(), open('out.txt').read())\nopen('in.txt', 'w').write('fork')"})
	if r.Stdout != "hello run\n" {
		t.Errorf("run in the fork: %+v", r)
	}
	r = runCode(t, cs, map[string]any{"language": "python", "conversationId": "s3-src", "code": "print(open('in.txt').read())"})
	if r.Stdout != "hello\n" {
		t.Errorf("a write in the fork changed the source: %q", r.Stdout)
	}
}
