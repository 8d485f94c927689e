package store

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/runbox-dev/runbox"
)

func newParallelRun(t *testing.T, s *Store, id, cid string) runbox.Admission {
	t.Helper()
	adm, _, err := s.CreateRun(context.Background(), runbox.NewRun{
		Run:        runbox.Run{ID: id, ConversationID: cid, Language: "shell", CreatedAt: time.Now()},
		Spec:       runbox.Spec{Language: "shell", Code: "echo " + id, ConversationID: cid, Parallel: true},
		MaxWaiting: 1,
		Parallel:   true,
	})
	if err != nil {
		t.Fatal(err)
	}
	return adm
}

// TestParallelRuns: a parallel run is enqueued at once whatever its
// conversation runs, takes no part in the order (neither waits in it nor
// holds it, nor counts against the runs waiting), and is remembered for
// the sweep until an executor claims it or the sweep forgets it.
func TestParallelRuns(t *testing.T) {
	backends(t, func(t *testing.T, s *Store) {
		ctx := context.Background()
		newRunIn(t, s, "head", "conv")
		newRunIn(t, s, "waiting", "conv")
		for _, id := range []string{"p1", "p2", "p3"} {
			if adm := newParallelRun(t, s, id, "conv"); adm != runbox.AdmitEnqueue {
				t.Fatalf("parallel run %s: %v, want Enqueue", id, adm)
			}
		}
		stale, err := s.StaleParallel(ctx, time.Now().Add(time.Second), 10)
		if err != nil || fmt.Sprint(stale) != "[p1 p2 p3]" {
			t.Fatalf("StaleParallel = %v, %v", stale, err)
		}
		if old, _ := s.StaleParallel(ctx, time.Now().Add(-time.Hour), 10); len(old) != 0 {
			t.Errorf("runs made an hour ago: %v", old)
		}
		if ok, err := s.Claim(ctx, "p1", "ex", time.Minute); err != nil || !ok {
			t.Fatalf("Claim p1 = %v, %v", ok, err)
		}
		if err := s.ForgetParallel(ctx, "p3"); err != nil {
			t.Fatal(err)
		}
		if stale, _ := s.StaleParallel(ctx, time.Now().Add(time.Second), 10); fmt.Sprint(stale) != "[p2]" {
			t.Errorf("after a claim and a forget: %v, want [p2]", stale)
		}
		// Its end does not move the conversation on: head still heads it.
		if a := finish(t, s, "p1", "conv", runbox.StatusRunning); !a.Done || len(a.Dispatch) != 0 {
			t.Errorf("end of a parallel run: %+v", a)
		}
		if heads := heads(t, s); len(heads) != 1 || heads["conv"] != "head" {
			t.Errorf("heads %+v, want conv headed by head", heads)
		}
		s.Claim(ctx, "head", "ex", time.Minute)
		if a := finish(t, s, "head", "conv", runbox.StatusRunning); fmt.Sprint(a.Dispatch) != "[waiting]" {
			t.Errorf("after head: dispatch %v, want [waiting]", a.Dispatch)
		}
	})
}

// TestDetach: a detached run hands its conversation to the next run
// while it runs on, and its end then moves nothing.
func TestDetach(t *testing.T) {
	backends(t, func(t *testing.T, s *Store) {
		ctx := context.Background()
		newRunIn(t, s, "server", "conv")
		newRunIn(t, s, "next", "conv")
		if next, err := s.Detach(ctx, "server", "conv"); err == nil {
			t.Fatalf("a queued run detached (next %v)", next)
		}
		s.Claim(ctx, "server", "ex", time.Minute)
		next, err := s.Detach(ctx, "server", "conv")
		if err != nil || fmt.Sprint(next) != "[next]" {
			t.Fatalf("Detach = %v, %v, want [next]", next, err)
		}
		run, _ := s.Run(ctx, "server")
		if run.Status != runbox.StatusRunning {
			t.Errorf("a detached run is %s", run.Status)
		}
		evs, _ := s.Events(ctx, "server", 0)
		if types := eventTypes(evs); fmt.Sprint(types) != "[queued started detached]" {
			t.Errorf("events %v", types)
		}
		if busy, _ := s.Busy(ctx, "conv"); !busy {
			t.Error("a conversation with a detached run and a head is not busy")
		}
		s.Claim(ctx, "next", "ex", time.Minute)
		if a := finish(t, s, "next", "conv", runbox.StatusRunning); len(a.Dispatch) != 0 {
			t.Errorf("after next: %+v", a)
		}
		// Only the detached run is left: the conversation is still busy.
		if busy, _ := s.Busy(ctx, "conv"); !busy {
			t.Error("a conversation with a detached run is not busy")
		}
		if a := finish(t, s, "server", "conv", runbox.StatusRunning); !a.Done || len(a.Dispatch) != 0 {
			t.Errorf("end of the detached run: %+v", a)
		}
		if busy, _ := s.Busy(ctx, "conv"); busy {
			t.Error("an idle conversation is busy")
		}
		if heads := heads(t, s); len(heads) != 0 {
			t.Errorf("heads %+v", heads)
		}
	})
}

// TestAffinity: while a conversation has live runs on a live executor,
// another executor does not claim its runs and is told where they go;
// once they end, or that executor's heartbeat lapses, any may.
func TestAffinity(t *testing.T) {
	backends(t, func(t *testing.T, s *Store) {
		ctx := context.Background()
		for _, ex := range []string{"ex1", "ex2"} {
			if err := s.Heartbeat(ctx, runbox.ExecutorInfo{ID: ex}, time.Minute); err != nil {
				t.Fatal(err)
			}
		}
		for _, id := range []string{"a", "b", "c"} {
			newParallelRun(t, s, id, "conv")
		}
		if c, err := s.ClaimFor(ctx, "a", "ex1", time.Minute, time.Minute); err != nil || !c.OK {
			t.Fatalf("claim a on ex1: %+v, %v", c, err)
		}
		if o, _ := s.Owner(ctx, "conv"); o != "ex1" {
			t.Errorf("owner %q, want ex1", o)
		}
		c, err := s.ClaimFor(ctx, "b", "ex2", time.Minute, time.Minute)
		if err != nil || c.OK || c.Elsewhere != "ex1" {
			t.Fatalf("claim b on ex2: %+v, %v; want elsewhere ex1", c, err)
		}
		if c, _ := s.ClaimFor(ctx, "b", "ex1", time.Minute, time.Minute); !c.OK {
			t.Fatalf("claim b on ex1: %+v", c)
		}
		finish(t, s, "a", "conv", runbox.StatusRunning)
		if c, _ := s.ClaimFor(ctx, "c", "ex2", time.Minute, time.Minute); c.OK || c.Elsewhere != "ex1" {
			t.Fatalf("claim c on ex2 while b lives on ex1: %+v", c)
		}
		// ex1 dies: its live runs no longer hold the conversation.
		if err := s.Unregister(ctx, "ex1"); err != nil {
			t.Fatal(err)
		}
		if c, _ := s.ClaimFor(ctx, "c", "ex2", time.Minute, time.Minute); !c.OK {
			t.Fatalf("claim c on ex2 after ex1 died: %+v", c)
		}
		if o, _ := s.Owner(ctx, "conv"); o != "ex2" {
			t.Errorf("owner %q, want ex2", o)
		}
		// The watchdog ends b (ex1's): c's place is kept.
		finish(t, s, "b", "conv", runbox.StatusRunning)
		newParallelRun(t, s, "d", "conv")
		if c, _ := s.ClaimFor(ctx, "d", "ex1", time.Minute, time.Minute); c.Elsewhere != "ex2" {
			t.Errorf("claim d on ex1 while c lives on ex2: %+v", c)
		}
		finish(t, s, "c", "conv", runbox.StatusRunning)
		if busy, _ := s.Busy(ctx, "conv"); busy {
			t.Error("no run is live, yet the conversation is busy")
		}
	})
}

func eventTypes(evs []runbox.Event) []string {
	var out []string
	for _, ev := range evs {
		out = append(out, ev.Type)
	}
	return slices.Clip(out)
}
