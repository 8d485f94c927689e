package e2e

import (
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// TestDeadPeer: an executor killed with SIGKILL leaves its sandboxes and
// its pool's slots; a live peer on the same Docker host removes them
// within 60 s of the dead one's heartbeat lapsing (10 s), and keeps its
// own. An executor that stops in order removes those of a peer killed a
// moment before, its heartbeat still current: it may be the last one.
func TestDeadPeer(t *testing.T) {
	t.Run("a live peer reaps", func(t *testing.T) {
		s := start(t, options{executors: 2})
		victim, survivor := s.executors[0], s.executors[1]
		waitPools(t, s, victim, survivor)
		own := s.containerIDs(survivor)
		killedAt := time.Now()
		kill(t, s, victim)
		deadline := 10*time.Second + 60*time.Second
		for s.containers(victim) > 0 {
			if time.Since(killedAt) > deadline {
				t.Fatalf("the dead executor's sandboxes outlived it by %v", deadline)
			}
			time.Sleep(200 * time.Millisecond)
		}
		t.Logf("reaped %v after the kill", time.Since(killedAt).Round(time.Second))
		for id := range own {
			if !s.containerExists(id) {
				t.Errorf("the survivor's sandbox %s was removed", id[:12])
			}
		}
		waitFor(t, func() bool { return slots(t, s, victim) == 0 })
	})

	t.Run("the last one standing reaps on its way out", func(t *testing.T) {
		s := start(t, options{executors: 2})
		victim, last := s.executors[0], s.executors[1]
		waitPools(t, s, victim, last)
		kill(t, s, victim)
		p := proc0(t, s, last)
		if err := p.cmd.Process.Signal(os.Interrupt); err != nil {
			t.Fatal(err)
		}
		select {
		case <-p.done:
		case <-time.After(60 * time.Second):
			t.Fatal("the executor did not stop")
		}
		for _, id := range []string{victim, last} {
			if n := s.containers(id); n != 0 {
				t.Errorf("executor %s left %d sandboxes", id, n)
			}
			if n := slots(t, s, id); n != 0 {
				t.Errorf("executor %s left %d slots", id, n)
			}
		}
		if !strings.Contains(p.out.String(), "removed the sandboxes of a dead executor") {
			t.Error("the stopping executor did not report reaping its dead peer")
		}
	})
}

// waitPools waits until each executor has started sandboxes.
func waitPools(t *testing.T, s *service, executors ...string) {
	t.Helper()
	waitFor(t, func() bool {
		for _, id := range executors {
			if s.containers(id) == 0 || slots(t, s, id) == 0 {
				return false
			}
		}
		return true
	})
}

func proc0(t *testing.T, s *service, executor string) *proc {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, p := range s.procs {
		if p.name == "executor "+executor {
			return p
		}
	}
	t.Fatalf("no process of executor %s", executor)
	return nil
}

// kill ends an executor with SIGKILL and waits for it to be gone.
func kill(t *testing.T, s *service, executor string) {
	t.Helper()
	p := proc0(t, s, executor)
	if err := p.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-p.done
}

// slots counts the pool slots of an executor under the service's root.
func slots(t *testing.T, s *service, executor string) int {
	t.Helper()
	m, err := filepath.Glob(filepath.Join(s.root, ".pool", executor+"~*"))
	if err != nil {
		t.Fatal(err)
	}
	return len(m)
}
