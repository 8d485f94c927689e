package e2e

import (
	"fmt"
	"strings"
	"testing"
	"time"
)

// TestAffinity: with two executors, a conversation's runs go to the one
// that holds its sandbox, so its kept interpreter is there every time; when
// that executor dies, the next run goes to the other, and says the state
// was lost.
func TestAffinity(t *testing.T) {
	s := start(t, options{executors: 2})
	cs := s.session(nil)
	kept := func(code string) result {
		t.Helper()
		return runCode(t, cs, map[string]any{"language": "python", "conversationId": "aff", "keep_state": true, "code": code})
	}
	host := strings.TrimSpace(kept("import socket\nn = 0\nprint(socket.gethostname())").Stdout)
	for i := range 6 {
		if i%3 == 2 { // a fresh run in between goes there too
			if r := runCode(t, cs, map[string]any{"language": "bash", "conversationId": "aff", "code": "hostname"}); strings.TrimSpace(r.Stdout) == "" {
				t.Fatalf("bash run: %+v", r)
			}
		}
		r := kept("n += 1\nprint(n, socket.gethostname())")
		if want := fmt.Sprintf("%d %s\n", i+1, host); r.Stdout != want || r.StateLost {
			t.Fatalf("run %d: stdout %q state_lost %v (stderr %q); want %q", i, r.Stdout, r.StateLost, r.Stderr, want)
		}
	}

	victimID := s.containerExecutor(host)
	var victim *proc
	s.mu.Lock()
	for _, p := range s.procs {
		if p.name == "executor "+victimID {
			victim = p
		}
	}
	s.mu.Unlock()
	if victim == nil {
		t.Fatalf("no executor runs container %s", host)
	}
	orphans := s.containerIDs(victimID)
	if err := victim.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	<-victim.done
	begin := time.Now()
	r := kept("print('n' in globals())")
	if r.Stdout != "False\n" || !r.StateLost {
		t.Errorf("after its executor died: %+v", r)
	}
	t.Logf("the run after the owner died took %v", time.Since(begin))

	// Reap the dead executor's sandboxes: a restart with its id does.
	p := s.spawn("executor "+victimID+" (restarted)", bin.executor, "EXECUTOR_ID="+victimID)
	waitFor(t, func() bool { return strings.Contains(p.out.String(), "executor started") })
	for id := range orphans {
		if s.containerExists(id) {
			t.Errorf("orphan %s survived the restart", id)
		}
	}
}
