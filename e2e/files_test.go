package e2e

import (
	"bytes"
	"context"
	"encoding/base64"
	"image/png"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"
)

type uploaded struct {
	ConversationID string `json:"conversationId"`
	fileInfo
}

func upload(t *testing.T, cs *mcp.ClientSession, args map[string]any) (uploaded, toolError, bool) {
	t.Helper()
	var up uploaded
	res := call(t, cs, "upload_file", args, &up)
	if res.IsError {
		var e toolError
		b := text(res)
		_ = jsonUnmarshal(b, &e)
		return up, e, false
	}
	return up, toolError{}, true
}

// scenario is the Code Interpreter workflow in small: upload, analyse,
// chart, look at the chart, list, read, close. It runs over every
// transport.
func scenario(t *testing.T, s *service, cs *mcp.ClientSession, cid string) {
	csv := "month,sales\njan,10\nfeb,14\nmar,9\n"
	up, e, ok := upload(t, cs, map[string]any{"conversationId": cid, "filename": "sales.csv",
		"content_base64": base64.StdEncoding.EncodeToString([]byte(csv))})
	if !ok {
		t.Fatalf("upload: %+v", e)
	}
	if up.ConversationID != cid || up.Path != "/data/sales.csv" || up.SizeBytes != int64(len(csv)) || up.URL == "" {
		t.Errorf("upload result %+v", up)
	}

	var r result
	res := call(t, cs, "run_code", map[string]any{"language": "python", "conversationId": cid, "code": `
import pandas as pd, matplotlib.pyplot as plt
df = pd.read_csv('sales.csv')
print(df['sales'].sum())
df.plot(x='month', y='sales', kind='bar')
plt.savefig('chart.png')
`}, &r)
	if res.IsError || !r.Success || r.Stdout != "33\n" {
		t.Fatalf("analysis: %s", text(res))
	}
	if len(r.Artifacts) != 1 || r.Artifacts[0].Name != "chart.png" || r.Artifacts[0].MimeType != "image/png" {
		t.Errorf("artifacts %+v", r.Artifacts)
	}
	images := 0
	for _, c := range res.Content {
		if img, ok := c.(*mcp.ImageContent); ok {
			images++
			if img.MIMEType != "image/png" {
				t.Errorf("inline image type %s", img.MIMEType)
			}
		}
	}
	if images != 1 {
		t.Errorf("%d inline images, want the new chart", images)
	}

	var list struct {
		Files []fileInfo `json:"files"`
	}
	for _, name := range []string{"list_files"} {
		call(t, cs, name, map[string]any{"conversationId": cid}, &list)
		if len(list.Files) != 2 || list.Files[0].Name != "chart.png" || list.Files[1].Name != "sales.csv" {
			t.Errorf("%s: %+v", name, list.Files)
		}
	}

	// The model looks at its chart.
	for _, name := range []string{"read_file"} {
		var fi fileInfo
		res = call(t, cs, name, map[string]any{"conversationId": cid, "name": "chart.png"}, &fi)
		img, ok := res.Content[0].(*mcp.ImageContent)
		if res.IsError || !ok || img.MIMEType != "image/png" {
			t.Fatalf("%s of the chart: %s", name, text(res))
		}
		if _, err := png.Decode(bytes.NewReader(img.Data)); err != nil {
			t.Errorf("%s: not a valid PNG: %v", name, err)
		}
		if fi.Name != "chart.png" || fi.URL == "" || fi.MimeType != "image/png" {
			t.Errorf("%s file info %+v", name, fi)
		}
	}
	res = call(t, cs, "read_file", map[string]any{"conversationId": cid, "path": "/data/sales.csv"}, nil)
	if tc, ok := res.Content[0].(*mcp.TextContent); !ok || tc.Text != csv {
		t.Errorf("read_file of the CSV: %s", text(res))
	}

	var closed map[string]string
	if res := call(t, cs, "close_session", map[string]any{"conversationId": cid}, &closed); res.IsError || closed["status"] != "closed" {
		t.Errorf("close_session: %s", text(res))
	}
	if _, err := os.Stat(s.root + "/" + cid); !os.IsNotExist(err) {
		t.Errorf("files remain after close_session: %v", err)
	}
}

func TestTransports(t *testing.T) {
	s := start(t, options{})
	t.Run("streamable HTTP at /mcp", func(t *testing.T) {
		scenario(t, s, s.session(nil), "via-streamable")
	})
	t.Run("HTTP+SSE at /mcp/events", func(t *testing.T) {
		c := mcp.NewClient(&mcp.Implementation{Name: "e2e-sse", Version: "1"}, nil)
		cs, err := c.Connect(context.Background(), &mcp.SSEClientTransport{
			Endpoint: s.url + "/mcp/events", HTTPClient: &http.Client{Transport: bearer{Token: token}},
		}, nil)
		if err != nil {
			t.Fatal(err)
		}
		defer cs.Close()
		scenario(t, s, cs, "via-sse")
	})
	t.Run("stdio", func(t *testing.T) {
		cmd := exec.Command(bin.api, "--stdio")
		cmd.Env = s.env
		var stderr syncBuffer
		cmd.Stderr = &stderr
		c := mcp.NewClient(&mcp.Implementation{Name: "e2e-stdio", Version: "1"}, nil)
		cs, err := c.Connect(context.Background(), &mcp.CommandTransport{Command: cmd}, nil)
		if err != nil {
			t.Fatal(err)
		}
		scenario(t, s, cs, "via-stdio")
		cs.Close()
		if t.Failed() {
			t.Logf("api --stdio said:\n%s", stderr.String())
		}
	})
}

func TestFilesBadInput(t *testing.T) {
	s := start(t, options{env: []string{"SANDBOX_QUOTA_BYTES=8388608", "SANDBOX_MAX_UPLOAD_BYTES=6291456", "SANDBOX_MAX_READ_BYTES=1024"}})
	cs := s.session(nil)
	b64 := func(n int) string { return base64.StdEncoding.EncodeToString(bytes.Repeat([]byte("x"), n)) }
	cid := "bad-input"

	if _, e, ok := upload(t, cs, map[string]any{"conversationId": cid, "filename": "ok.txt", "content_base64": b64(10)}); !ok {
		t.Fatalf("upload: %+v", e)
	}
	cases := []struct {
		name string
		args map[string]any
		code string
	}{
		{"traversal", map[string]any{"filename": "../x", "content_base64": b64(1)}, "invalid_path"},
		{"absolute", map[string]any{"filename": "/etc/passwd", "content_base64": b64(1)}, "invalid_path"},
		{"subfolder", map[string]any{"filename": "a/b", "content_base64": b64(1)}, "invalid_path"},
		{"hidden", map[string]any{"filename": ".env", "content_base64": b64(1)}, "invalid_path"},
		{"NUL", map[string]any{"filename": "a\x00b", "content_base64": b64(1)}, "invalid_path"},
		{"300 bytes", map[string]any{"filename": strings.Repeat("n", 300), "content_base64": b64(1)}, "invalid_path"},
		{"oversized", map[string]any{"filename": "big.bin", "content_base64": b64(6<<20 + 10)}, "too_large"},
		{"not base64", map[string]any{"filename": "x.bin", "content_base64": "%%%"}, "invalid_argument"},
		{"exists", map[string]any{"filename": "ok.txt", "content_base64": b64(1)}, "file_exists"},
		{"conversation with ..", map[string]any{"conversationId": "..", "filename": "x.txt", "content_base64": b64(1)}, "invalid_argument"},
	}
	for _, c := range cases {
		if _, ok := c.args["conversationId"]; !ok {
			c.args["conversationId"] = cid
		}
		if _, e, ok := upload(t, cs, c.args); ok || e.Error != c.code {
			t.Errorf("%s: ok=%v %+v, want %s", c.name, ok, e, c.code)
		}
	}
	if up, e, ok := upload(t, cs, map[string]any{"conversationId": cid, "filename": "ok.txt", "content_base64": b64(3), "overwrite": true}); !ok || up.SizeBytes != 3 {
		t.Errorf("overwrite: %+v %+v", up, e)
	}
	// 5 MB fits, another 5 MB does not.
	if _, e, ok := upload(t, cs, map[string]any{"conversationId": cid, "filename": "five.bin", "content_base64": b64(5 << 20)}); !ok {
		t.Fatalf("5 MB upload: %+v", e)
	}
	if _, e, _ := upload(t, cs, map[string]any{"conversationId": cid, "filename": "five2.bin", "content_base64": b64(5 << 20)}); e.Error != "quota_exceeded" {
		t.Errorf("over the quota: %+v", e)
	}

	// A program makes a link to a host file, and a file too large to read inline.
	runCode(t, cs, map[string]any{"language": "bash", "conversationId": cid,
		"code": "ln -s /etc/passwd passwd; ln -s ../../.. up; head -c 2000 /dev/zero > zeros.bin"})
	reads := []struct {
		args map[string]any
		code string
	}{
		{map[string]any{"conversationId": cid, "name": "missing.txt"}, "not_found"},
		{map[string]any{"conversationId": cid, "name": "passwd"}, "not_found"},
		{map[string]any{"conversationId": cid, "name": "up/etc/passwd"}, "not_found"},
		{map[string]any{"conversationId": cid, "name": "../../etc/passwd"}, "invalid_path"},
		{map[string]any{"conversationId": "../x", "name": "ok.txt"}, "invalid_argument"},
		{map[string]any{"conversationId": cid, "name": "zeros.bin"}, "artifact_too_large"},
	}
	for _, r := range reads {
		var e struct {
			toolError
			URL string `json:"url"`
		}
		res := call(t, cs, "read_file", r.args, &e)
		if !res.IsError || e.Error != r.code || strings.Contains(e.Message, s.root) {
			t.Errorf("read_file %v: %s, want %s", r.args, text(res), r.code)
		}
		if r.code == "artifact_too_large" {
			if code, body := get(t, e.URL); code != 200 || len(body) != 2000 {
				t.Errorf("the URL of a file too large to read: %d %d bytes", code, len(body))
			}
		}
	}

	// A run that writes past the quota is stopped and reported; the disk
	// holds no more than the quota.
	start := time.Now()
	r := runCode(t, cs, map[string]any{"language": "bash", "conversationId": cid,
		"code": "fallocate -l 1G huge.bin 2>&1; for i in $(seq 1 100); do head -c 1048576 /dev/zero > fill$i.bin || break; done; sleep 30"})
	if r.Success || !strings.Contains(r.Error, "quota") {
		t.Errorf("writing past the quota: %+v", r)
	}
	if d := time.Since(start); d > 20*time.Second {
		t.Errorf("the run went on for %v past the quota", d)
	}
	var used int64
	for _, f := range r.Files {
		used += f.SizeBytes
	}
	if used > 8<<20 {
		t.Errorf("the conversation's files hold %d bytes, over the 8 MiB quota", used)
	}

	// REST: raw upload, list, get, and the same checks.
	req, _ := http.NewRequest("PUT", s.url+"/v1/conversations/rest-files/files/notes.txt", strings.NewReader("hello"))
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusCreated {
		t.Errorf("PUT file: %d", resp.StatusCode)
	}
	for path, want := range map[string]int{
		"/v1/conversations/rest-files/files/notes.txt?overwrite=false": http.StatusConflict,
		"/v1/conversations/rest-files/files/.hidden":                   http.StatusBadRequest,
	} {
		req, _ := http.NewRequest("PUT", s.url+path, strings.NewReader("x"))
		req.Header.Set("Authorization", "Bearer "+token)
		resp, _ := http.DefaultClient.Do(req)
		resp.Body.Close()
		if resp.StatusCode != want {
			t.Errorf("PUT %s: %d, want %d", path, resp.StatusCode, want)
		}
	}
	var files struct {
		Files []fileInfo `json:"files"`
	}
	if code := s.request("GET", "/v1/conversations/rest-files/files", nil, &files); code != 200 || len(files.Files) != 1 {
		t.Errorf("GET files: %d %+v", code, files)
	}
	req, _ = http.NewRequest("GET", s.url+"/v1/conversations/rest-files/files/notes.txt", nil)
	req.Header.Set("Authorization", "Bearer "+token)
	resp, _ = http.DefaultClient.Do(req)
	var body bytes.Buffer
	body.ReadFrom(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || body.String() != "hello" {
		t.Errorf("GET file: %d %q", resp.StatusCode, body.String())
	}
	var closed map[string]string
	if code := s.request("DELETE", "/v1/conversations/rest-files", nil, &closed); code != 200 || closed["status"] != "closed" {
		t.Errorf("DELETE conversation: %d %v", code, closed)
	}
}

// TestCloseSessionEndsRuns: closing a conversation cancels its running and
// waiting runs and removes its sandboxes and files.
func TestCloseSessionEndsRuns(t *testing.T) {
	s := start(t, options{})
	cs := s.session(nil)
	cid := "closing"
	a := startRun(t, cs, map[string]any{"language": "bash", "conversationId": cid, "code": "cat /etc/hostname > f.txt; sleep 60"})
	b := startRun(t, cs, map[string]any{"language": "bash", "conversationId": cid, "code": "touch never"})
	var host []byte
	waitFor(t, func() bool {
		host, _ = os.ReadFile(s.root + "/" + cid + "/files/f.txt")
		return len(host) > 0
	})
	if res := call(t, cs, "close_session", map[string]any{"conversationId": cid}, nil); res.IsError {
		t.Fatal(text(res))
	}
	for _, id := range []string{a.RunID, b.RunID} {
		var p progress
		call(t, cs, "get_run", map[string]any{"run_id": id}, &p)
		if p.Status != "cancelled" {
			t.Errorf("run %s is %s after close_session", id, p.Status)
		}
	}
	waitFor(t, func() bool { return !s.containerExists(string(host)) })
	if _, err := os.Stat(s.root + "/" + cid); !os.IsNotExist(err) {
		t.Errorf("files left: %v", err)
	}
}

// TestQuotaBurst: a run that reaches the quota and ends before the
// executor's next measurement of its folder (every 250 ms) is reported at
// the quota all the same, in both modes (walk: nothing refuses the
// writes; loop: the program sees ENOSPC, or the image fills without it);
// so is a next run that adds to it; a run that frees space runs.
func TestQuotaBurst(t *testing.T) {
	for _, mode := range []string{"walk", "loop"} {
		t.Run(mode, func(t *testing.T) {
			s := start(t, options{env: []string{"SANDBOX_QUOTA_BYTES=8388608", "SANDBOX_QUOTA_MODE=" + mode}})
			cs := s.session(nil)
			r := runCode(t, cs, map[string]any{"language": "python", "conversationId": "burst",
				"code": "for i in range(3):\n    open(f'part{i}.bin', 'wb').write(b'x' * (4 << 20))"})
			atQuota := func(r result) bool {
				return strings.Contains(r.Error, "quota of 8388608 bytes") || mode == "loop" && strings.Contains(r.Stderr, "No space left on device")
			}
			if r.Success || !atQuota(r) {
				t.Errorf("12 MB written at once in an 8 MB quota, in files of 4 MB: %+v", r)
			}
			// What a run adds to a conversation already at (in walk mode,
			// past) its quota is seen and stopped too.
			r = runCode(t, cs, map[string]any{"language": "python", "conversationId": "burst",
				"code": "import time\nopen('more.bin', 'wb').write(b'x' * (4 << 20))\ntime.sleep(1)"})
			if r.Success || !atQuota(r) {
				t.Errorf("4 MB more in a conversation at its quota: %+v", r)
			}
			r = runCode(t, cs, map[string]any{"language": "python", "conversationId": "burst",
				"code": "import glob, os\nfor f in glob.glob('*.bin'):\n    os.remove(f)\nprint('freed')"})
			if !r.Success || r.Stdout != "freed\n" {
				t.Errorf("the run that frees it: %+v", r)
			}
		})
	}
}
