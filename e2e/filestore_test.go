package e2e

import (
	"context"
	"encoding/base64"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/runbox-dev/runbox/internal/s3store"
)

// TestS3FileStore: with FILE_STORE in a real S3 server, two executors with
// SANDBOX_ROOTs of their own share only Redis and the store. The api keeps
// no files; downloads come from the store; a conversation's files and
// uploads follow it to the other executor when the first stops.
func TestS3FileStore(t *testing.T) {
	s := start(t, options{executors: 2, s3: true})
	cs := s.session(nil)
	ctx := context.Background()
	cfg := *s.s3
	cfg.Prefix = "files/"
	bucket, err := s3store.Open(ctx, &cfg, 1<<30)
	if err != nil {
		t.Fatal(err)
	}
	t.Run("workflow", func(t *testing.T) { scenario(t, s, cs, "s3-workflow") })

	const cid = "s3-moves"
	put := func(name, content string) {
		t.Helper()
		if _, e, ok := upload(t, cs, map[string]any{"conversationId": cid, "filename": name,
			"content_base64": base64.StdEncoding.EncodeToString([]byte(content))}); !ok {
			t.Fatalf("upload %s: %+v", name, e)
		}
	}
	put("in.txt", "hello")
	r := runCode(t, cs, map[string]any{"language": "python", "conversationId": cid, "code": `
import socket
print(open('in.txt').read())
open('out.txt', 'w').write('from the first')
print(socket.gethostname())`})
	lines := strings.Split(strings.TrimSpace(r.Stdout), "\n")
	if !r.Success || lines[0] != "hello" {
		t.Fatalf("first run: %+v", r)
	}
	first := s.containerExecutor(lines[len(lines)-1])

	// The result's link is served from the store: the api has no folder.
	i := slices.IndexFunc(r.Files, func(f fileInfo) bool { return f.Name == "out.txt" })
	if i < 0 {
		t.Fatalf("files %+v", r.Files)
	}
	if code, body := get(t, r.Files[i].URL); code != 200 || string(body) != "from the first" {
		t.Errorf("download: %d %q", code, body)
	}
	if inStore, err := bucket.List(ctx, cid); err != nil || len(inStore) != 2 {
		t.Errorf("the store holds %+v, %v", inStore, err)
	}
	// (The audit chain's key is the api's own, kept there.)
	filepath.WalkDir(s.root, func(p string, d os.DirEntry, err error) error {
		if err == nil && p != s.root && filepath.Base(p) != ".audit-key" {
			t.Errorf("the api's SANDBOX_ROOT holds %s", p)
		}
		return nil
	})

	// The first executor stops; an upload comes meanwhile; the next run
	// goes to the other executor and finds every file.
	s.mu.Lock()
	var victim *proc
	for _, p := range s.procs {
		if p.name == "executor "+first {
			victim = p
		}
	}
	s.mu.Unlock()
	if err := victim.cmd.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	<-victim.done
	put("in2.txt", "more")
	r = runCode(t, cs, map[string]any{"language": "python", "conversationId": cid, "code": `
import os, socket
print(sorted(os.listdir('.')), open('out.txt').read(), open('in2.txt').read())
print(socket.gethostname())`})
	lines = strings.Split(strings.TrimSpace(r.Stdout), "\n")
	if !r.Success || lines[0] != "['in.txt', 'in2.txt', 'out.txt'] from the first more" {
		t.Fatalf("run on the other executor: %+v", r)
	}
	if second := s.containerExecutor(lines[len(lines)-1]); second == first {
		t.Fatalf("the run went to the stopped executor %s", first)
	}

	// Warm runs with the store: what a run costs end to end, logged.
	var took []time.Duration
	for range 20 {
		begin := time.Now()
		if r := runCode(t, cs, map[string]any{"language": "python", "conversationId": cid, "code": "print(1)"}); r.Stdout != "1\n" {
			t.Fatalf("warm run: %+v", r)
		}
		took = append(took, time.Since(begin))
	}
	sort.Slice(took, func(i, j int) bool { return took[i] < took[j] })
	t.Logf("warm print(1) over /mcp with the S3 store: p50 %v, max %v", took[len(took)/2], took[len(took)-1])

	var closed map[string]string
	if res := call(t, cs, "close_session", map[string]any{"conversationId": cid}, &closed); res.IsError {
		t.Fatalf("close_session: %s", text(res))
	}
	if inStore, err := bucket.List(ctx, cid); err != nil || len(inStore) != 0 {
		t.Errorf("after close the store holds %+v, %v", inStore, err)
	}
}
