package kubernetes

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/runbox-dev/runbox/internal/agent"
	"github.com/runbox-dev/runbox/internal/sparse/sparsetest"
)

func frame(typ byte, payload string) []byte {
	b := make([]byte, 5, 5+len(payload))
	b[0] = typ
	binary.BigEndian.PutUint32(b[1:], uint32(len(payload)))
	return append(b, payload...)
}

// fakeCopier logs its copies into the same log as the frames.
type fakeCopier struct {
	mu  sync.Mutex
	log *[]string
	err error
}

func (f *fakeCopier) copyIn() error        { return f.note("copy in") }
func (f *fakeCopier) copyOut([]byte) error { return f.note("copy out") }
func (f *fakeCopier) note(s string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	*f.log = append(*f.log, s)
	return f.err
}

// pod is the agent's end: what it reads is logged; once it has read a
// run's header it answers with reply.
type pod struct {
	io.Reader
	reply func()
	mu    *sync.Mutex
	log   *[]string
}

func (p pod) Write(b []byte) (int, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	*p.log = append(*p.log, "to agent "+string(b[0]))
	if b[0] == 'R' && p.reply != nil {
		go p.reply()
	}
	return len(b), nil
}

func TestSyncFilesAroundRuns(t *testing.T) {
	var log []string
	c := &fakeCopier{log: &log}
	agentOut := bytes.Join([][]byte{frame('o', "1\n"), frame('x', "{}")}, nil)
	r, w := io.Pipe()
	reply := func() {
		w.Write(agentOut)
		w.Close()
	}
	s := syncFiles(pod{Reader: r, reply: reply, mu: &c.mu, log: &log}, c)
	defer s.Close()

	// The run goes in whole (a frame written in pieces), after the copy in.
	run := frame('R', `{"code":"print(1)"}`)
	s.Write(run[:3])
	s.Write(run[3:])
	got, err := io.ReadAll(s)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, agentOut) {
		t.Fatalf("the manager read %q; want %q", got, agentOut)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	want := "copy in,to agent R,copy out"
	if have := strings.Join(filter(log), ","); have != want {
		t.Fatalf("order %q; want %q", have, want)
	}
}

// filter leaves out the header's pieces: only a frame's first write
// names it.
func filter(log []string) []string {
	var out []string
	for _, l := range log {
		if l == "to agent R" || strings.HasPrefix(l, "copy") {
			if len(out) == 0 || out[len(out)-1] != l {
				out = append(out, l)
			}
		}
	}
	return out
}

func TestSyncFilesFailureEndsTheStream(t *testing.T) {
	var log []string
	c := &fakeCopier{log: &log, err: errors.New("tar failed")}
	s := syncFiles(pod{Reader: bytes.NewReader(frame('x', "{}")), mu: &c.mu, log: &log}, c)
	defer s.Close()
	if _, err := io.ReadAll(s); err == nil || !strings.Contains(err.Error(), "tar failed") {
		t.Fatalf("read: %v; want the copy's error", err)
	}
	if _, err := s.Write(frame('R', "{}")); err == nil {
		// The write may be taken before the copy fails; the next is not.
		if _, err := s.Write(frame('R', "{}")); err == nil {
			t.Fatal("runs still go in after a failed copy")
		}
	}
}

// A failed copy in ends the manager's reads too: the run it held back is
// never sent, and the manager must not wait for its output.
func TestSyncFilesCopyInFailureEndsReads(t *testing.T) {
	var log []string
	c := &fakeCopier{log: &log, err: errors.New("no folder")}
	r, w := io.Pipe() // the agent, which says nothing until a run comes
	defer w.Close()
	s := syncFiles(pod{Reader: r, mu: &c.mu, log: &log}, c)
	defer s.Close()
	go s.Write(frame('R', "{}"))
	if _, err := io.ReadAll(s); err == nil || !strings.Contains(err.Error(), "no folder") {
		t.Fatalf("read: %v; want the copy's error", err)
	}
}

func TestHeldFolderFollowsRenames(t *testing.T) {
	root := t.TempDir()
	slot := filepath.Join(root, "slot")
	if err := os.Mkdir(slot, 0o755); err != nil {
		t.Fatal(err)
	}
	h, err := holdFolder(slot)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	if p, err := h.path(); err != nil || p != slot {
		t.Fatalf("path %q, %v; want %q", p, err, slot)
	}
	conv := filepath.Join(root, "conversation")
	if err := os.Rename(slot, conv); err != nil {
		t.Fatal(err)
	}
	if p, err := h.path(); err != nil || p != conv {
		t.Fatalf("after the rename: path %q, %v; want %q", p, err, conv)
	}
	if err := os.Remove(conv); err != nil {
		t.Fatal(err)
	}
	if p, err := h.path(); err == nil {
		t.Fatalf("after the removal: path %q, want an error", p)
	}
}

func TestCopyOutOnlyWhenDataChanged(t *testing.T) {
	tests := []struct {
		name, outSum, exit string
		unchanged          bool
	}{
		{"same sum", "s1", `{"exit_code":0,"data_sum":"s1"}`, true},
		{"another sum", "s1", `{"exit_code":0,"data_sum":"s2"}`, false},
		{"no sum: an agent that does not tell", "s1", `{"exit_code":0}`, false},
		{"no copy out yet", "", `{"exit_code":0,"data_sum":""}`, false},
		{"not an exit", "s1", `data_sum s1`, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			f := &folderCopier{outSum: tt.outSum}
			if unchanged := f.unchanged(exitOf([]byte(tt.exit)).DataSum); unchanged != tt.unchanged {
				t.Errorf("unchanged: %v, want %v", unchanged, tt.unchanged)
			}
		})
	}
}

func TestStartEmptySkipsTheFirstCopyIn(t *testing.T) {
	tests := []struct {
		name  string
		files []string
		known bool // the pod's /data known to match: no copy in
	}{
		{"an empty folder (a pooled pod's)", nil, true},
		{"a folder with files", []string{"a.txt"}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			for _, name := range tt.files {
				if err := os.WriteFile(filepath.Join(dir, name), []byte("x"), 0o644); err != nil {
					t.Fatal(err)
				}
			}
			f := &folderCopier{}
			f.startEmpty(dir)
			if (f.last != nil) != tt.known {
				t.Fatalf("known: %v, want %v", f.last != nil, tt.known)
			}
			if !tt.known {
				return
			}
			// A file written after the start is copied in before the run.
			now, _ := snapshot(dir)
			if !maps.Equal(now, f.last) {
				t.Fatal("an unchanged folder differs from its start")
			}
			if err := os.WriteFile(filepath.Join(dir, "b.txt"), []byte("x"), 0o644); err != nil {
				t.Fatal(err)
			}
			if now, _ := snapshot(dir); maps.Equal(now, f.last) {
				t.Fatal("a changed folder matches its start")
			}
		})
	}
}

// TestCopyInLimit: a folder whose files take more than the sandbox's
// /data may hold, a sparse file counted whole (tar carries its holes as
// zeros, and the pod writes them), is not copied in.
func TestCopyInLimit(t *testing.T) {
	dir := t.TempDir()
	sparsetest.File(t, filepath.Join(dir, "sparse"), 2<<20)
	held, err := holdFolder(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	// No engine: a copy in that began would fail otherwise.
	f := &folderCopier{e: &Engine{}, dir: held, quota: agent.Quota{Bytes: 1 << 20}}
	if err := f.copyIn(); !errors.Is(err, ErrTooLarge) {
		t.Fatalf("copy in of a 2 MiB sparse file into 1 MiB: %v", err)
	}
}

// TestCopyOutSkippedPastQuota: a run whose agent stopped it past its
// quota has nothing copied out (the engine is not even asked), and the
// copier no longer takes the sandbox's /data for the folder's.
func TestCopyOutSkippedPastQuota(t *testing.T) {
	for _, bound := range []string{agent.QuotaBytes, agent.QuotaEntries} {
		t.Run(bound, func(t *testing.T) {
			f := &folderCopier{last: map[string]entryState{".": {}}, outSum: "s1"}
			if err := f.copyOut([]byte(`{"exit_code":-1,"signal":9,"quota":"` + bound + `"}`)); err != nil {
				t.Fatal(err)
			}
			if f.last != nil || f.outSum != "" {
				t.Errorf("after: last %v, sum %q; want the next run's copy in", f.last, f.outSum)
			}
		})
	}
}
