package e2e

import (
	"strings"
	"testing"
)

// TestAnnouncedRuns: with asynq polling every 20 s (stopping waits for its sleep: at most 30 s), runs still start at
// once — idle executors take them as they are announced — and asynq stays
// the queue of record (its tasks complete; the conversation moves on).
func TestAnnouncedRuns(t *testing.T) {
	s := start(t, options{env: []string{"EXECUTOR_POLL_INTERVAL=20s"}})
	cs := s.session(nil)
	const n = 6
	for i := range n {
		cid := "announced"
		if i%2 == 1 {
			cid = "" // a new conversation each time
		}
		r := runCode(t, cs, map[string]any{"language": "bash", "conversationId": cid, "code": "echo ok"})
		if r.Stdout != "ok\n" {
			t.Fatalf("run %d: %+v", i, r)
		}
	}
	s.mu.Lock()
	var took int
	for _, p := range s.procs {
		if strings.HasPrefix(p.name, "executor") {
			took += strings.Count(p.out.String(), "took an announced run")
		}
	}
	s.mu.Unlock()
	if took != n {
		t.Errorf("%d of %d runs were taken when announced", took, n)
	}
}
