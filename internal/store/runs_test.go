package store

import (
	"context"
	"errors"
	"fmt"
	"io"
	"testing"
	"time"

	"github.com/runbox-dev/runbox"
)

// heads returns the conversations that have a head, and their heads.
func heads(t *testing.T, s *Store) map[string]string {
	t.Helper()
	ctx := context.Background()
	cids, err := s.rdb.SMembers(ctx, busyConvsKey).Result()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]string{}
	for _, cid := range cids {
		if run, err := s.rdb.Get(ctx, conversationHeadKey(cid)).Result(); err == nil {
			out[cid] = run
		}
	}
	return out
}

// newRun creates a run in a conversation of its own.
func newRun(t *testing.T, s *Store, id string) {
	t.Helper()
	newRunIn(t, s, id, "c-"+id)
}

func newRunIn(t *testing.T, s *Store, id, cid string) runbox.Admission {
	t.Helper()
	adm, _, err := s.CreateRun(context.Background(), runbox.NewRun{
		Run:        runbox.Run{ID: id, ConversationID: cid, Language: "python", CreatedAt: time.Now()},
		Spec:       runbox.Spec{Language: "python", Code: "print('" + id + "')", ConversationID: cid},
		MaxWaiting: 3,
	})
	if err != nil {
		t.Fatal(err)
	}
	return adm
}

func finish(t *testing.T, s *Store, id, cid string, from runbox.Status) runbox.Applied {
	t.Helper()
	a, err := s.Finish(context.Background(), id, runbox.Ending{From: []runbox.Status{from}, Lease: runbox.LeaseDelete,
		Status: runbox.StatusSucceeded, Result: &runbox.Result{}, Conversation: cid})
	if err != nil {
		t.Fatal(err)
	}
	return a
}

func TestRunLifecycle(t *testing.T) {
	backends(t, func(t *testing.T, s *Store) {
		ctx := context.Background()
		newRun(t, s, "r1")
		spec, err := s.Spec(ctx, "r1")
		if err != nil || spec.Code != "print('r1')" {
			t.Fatalf("Spec = %+v, %v", spec, err)
		}
		if c, err := s.ClaimFor(ctx, "nope", "ex1", time.Minute, 0); err != nil || c.OK || c.Status != "" {
			t.Fatalf("claim of no run = %+v, %v", c, err)
		}
		c, err := s.ClaimFor(ctx, "r1", "ex1", time.Minute, time.Minute)
		if err != nil || !c.OK {
			t.Fatalf("Claim = %+v, %v", c, err)
		}
		// What to run comes with the claim, and the claim records the
		// run's conversation's owner.
		if c.Spec.Code != "print('r1')" || c.Spec.ConversationID != "c-r1" {
			t.Fatalf("the claim's spec: %+v", c.Spec)
		}
		if o, _ := s.Owner(ctx, "c-r1"); o != "" {
			t.Errorf("owner %q with no executor's heartbeat", o)
		}
		if c, _ := s.ClaimFor(ctx, "r1", "ex2", time.Minute, 0); c.OK || c.Status != runbox.StatusRunning {
			t.Fatalf("a running run was claimed again: %+v", c)
		}
		if err := s.Append(ctx, "r1", runbox.Event{Type: runbox.EventStdout, Data: "hi\n"}); err != nil {
			t.Fatal(err)
		}
		code := 0
		res := &runbox.Result{Success: true, Stdout: "hi\n", RunID: "r1"}
		a, err := s.Finish(ctx, "r1", runbox.Ending{From: []runbox.Status{runbox.StatusRunning}, Lease: runbox.LeaseDelete,
			Status: runbox.StatusSucceeded, Result: res, Events: []runbox.Event{{Type: runbox.EventExit, ExitCode: &code}}, Conversation: "c-r1"})
		if err != nil || !a.Done {
			t.Fatalf("Finish = %+v, %v", a, err)
		}
		if a, _ := s.Finish(ctx, "r1", runbox.Ending{From: []runbox.Status{runbox.StatusRunning}, Status: runbox.StatusError, Result: res}); a.Done {
			t.Error("a finished run was finished again")
		}
		if err := s.Append(ctx, "r1", runbox.Event{Type: runbox.EventStdout}); err == nil {
			t.Error("appended to a finished run")
		}

		evs, err := s.Events(ctx, "r1", 0)
		if err != nil {
			t.Fatal(err)
		}
		want := []string{"queued", "started", "stdout", "exit", "done"}
		if len(evs) != len(want) {
			t.Fatalf("events %+v, want types %v", evs, want)
		}
		for i, ev := range evs {
			if ev.Seq != int64(i+1) || ev.Type != want[i] {
				t.Errorf("event %d = seq %d %s, want seq %d %s", i, ev.Seq, ev.Type, i+1, want[i])
			}
		}
		if evs[4].Result == nil || evs[4].Result.Stdout != "hi\n" {
			t.Errorf("done event carries %+v", evs[4].Result)
		}
		if tail, _ := s.Events(ctx, "r1", 3); len(tail) != 2 || tail[0].Seq != 4 {
			t.Errorf("events after 3 = %+v", tail)
		}

		run, err := s.Run(ctx, "r1")
		if err != nil {
			t.Fatal(err)
		}
		if run.Status != runbox.StatusSucceeded || run.Result == nil || run.ConversationID != "c-r1" || run.StartedAt.IsZero() {
			t.Errorf("run record %+v", run)
		}
		if _, err := s.Run(ctx, "nope"); !errors.Is(err, runbox.ErrRunNotFound) {
			t.Errorf("Run of a missing id: %v", err)
		}
	})
}

func TestLeases(t *testing.T) {
	backends(t, func(t *testing.T, s *Store) {
		ctx := context.Background()
		newRun(t, s, "short")
		newRun(t, s, "long")
		s.Claim(ctx, "short", "ex", 50*time.Millisecond)
		s.Claim(ctx, "long", "ex", time.Hour)
		time.Sleep(100 * time.Millisecond)
		ids, err := s.ExpiredLeases(ctx, 10)
		if err != nil {
			t.Fatal(err)
		}
		if fmt.Sprint(ids) != "[short]" {
			t.Fatalf("expired = %v, want [short]", ids)
		}
		// A current lease protects the run from the watchdog's transition.
		a, err := s.Apply(ctx, "long", Transition{From: []runbox.Status{runbox.StatusRunning}, To: runbox.StatusError, Lease: runbox.LeaseExpired}, 0)
		if err != nil || a.Done {
			t.Fatalf("expired-lease transition of a live run = %+v, %v", a, err)
		}
		a, err = s.Finish(ctx, "short", runbox.Ending{From: []runbox.Status{runbox.StatusRunning}, Lease: runbox.LeaseExpired, Status: runbox.StatusError, Result: &runbox.Result{}})
		if err != nil || !a.Done {
			t.Fatalf("finish of an expired run = %+v, %v", a, err)
		}
		lost, err := s.RenewLeases(ctx, time.Minute, "short", "long")
		if err != nil {
			t.Fatal(err)
		}
		if fmt.Sprint(lost) != "[short]" {
			t.Errorf("lost = %v, want [short]", lost)
		}
	})
}

// TestConversationOrder: one run of a conversation at a time, in order;
// the rest wait, and past the limit new ones are refused.
func TestConversationOrder(t *testing.T) {
	backends(t, func(t *testing.T, s *Store) {
		ctx := context.Background()
		if adm := newRunIn(t, s, "a", "conv"); adm != runbox.AdmitEnqueue {
			t.Fatalf("first run: %v, want Enqueue", adm)
		}
		for _, id := range []string{"b", "c", "d"} {
			if adm := newRunIn(t, s, id, "conv"); adm != runbox.AdmitWait {
				t.Fatalf("run %s: %v, want Wait", id, adm)
			}
		}
		if adm := newRunIn(t, s, "other", "conv2"); adm != runbox.AdmitEnqueue {
			t.Fatalf("another conversation: %v", adm)
		}
		_, _, err := s.CreateRun(ctx, runbox.NewRun{Run: runbox.Run{ID: "e", ConversationID: "conv", CreatedAt: time.Now()}, MaxWaiting: 3})
		if runbox.ErrorCode(err) != runbox.EBusy {
			t.Fatalf("fourth waiting run: %v, want busy", err)
		}
		// c is cancelled while waiting: it leaves the line.
		if a := finish(t, s, "c", "conv", runbox.StatusQueued); !a.Done || len(a.Dispatch) != 0 {
			t.Fatalf("cancel of a waiting run: %+v", a)
		}
		s.Claim(ctx, "a", "ex", time.Minute)
		if a := finish(t, s, "a", "conv", runbox.StatusRunning); fmt.Sprint(a.Dispatch) != "[b]" {
			t.Fatalf("after a: dispatch %v, want [b]", a.Dispatch)
		}
		if heads := heads(t, s); len(heads) != 2 {
			t.Errorf("heads %v", heads)
		}
		// b's end was recorded by a process that died before moving on.
		s.Apply(ctx, "b", Transition{To: runbox.StatusError}, 0)
		next, err := s.Advance(ctx, runbox.ConversationHead{Conversation: "conv", Run: "b"})
		if err != nil || next != "d" {
			t.Fatalf("Advance = %q, %v, want d", next, err)
		}
		if next, _ := s.Advance(ctx, runbox.ConversationHead{Conversation: "conv", Run: "b"}); next != "" {
			t.Errorf("second Advance past b: %q", next)
		}
		if a := finish(t, s, "d", "conv", runbox.StatusQueued); !a.Done || len(a.Dispatch) != 0 {
			t.Fatalf("after d: %+v", a)
		}
		if adm := newRunIn(t, s, "f", "conv"); adm != runbox.AdmitEnqueue {
			t.Errorf("idle conversation: %v, want Enqueue", adm)
		}
		runs, err := s.RecentRuns(ctx, "", "conv", 10)
		if err != nil || len(runs) != 5 || runs[0].ID != "f" {
			t.Errorf("Runs = %v, %v", runs, err)
		}
	})
}

func TestIdempotency(t *testing.T) {
	backends(t, func(t *testing.T, s *Store) {
		ctx := context.Background()
		nr := func(id string) runbox.NewRun {
			return runbox.NewRun{Run: runbox.Run{ID: id, ConversationID: "c", CreatedAt: time.Now()}, Client: "alice", IdempotencyKey: "k1", MaxWaiting: 5}
		}
		if adm, id, err := s.CreateRun(ctx, nr("first")); err != nil || adm != runbox.AdmitEnqueue || id != "first" {
			t.Fatalf("first: %v %q %v", adm, id, err)
		}
		adm, id, err := s.CreateRun(ctx, nr("second"))
		if err != nil || adm != runbox.AdmitExists || id != "first" {
			t.Fatalf("retry: %v %q %v, want the first run", adm, id, err)
		}
		other := nr("third")
		other.Client = "bob"
		if adm, _, _ := s.CreateRun(ctx, other); adm == runbox.AdmitExists {
			t.Error("another client's key matched")
		}
	})
}

func TestStdin(t *testing.T) {
	backends(t, func(t *testing.T, s *Store) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		r := s.Stdin(ctx, "in1")
		go func() {
			s.SendStdin(ctx, "in1", []byte("one\n"), false)
			time.Sleep(50 * time.Millisecond)
			s.SendStdin(ctx, "in1", []byte("two\n"), true)
		}()
		b, err := io.ReadAll(r)
		if err != nil || string(b) != "one\ntwo\n" {
			t.Errorf("read %q, %v", b, err)
		}
		// A reader whose run ended stops.
		ctx2, cancel2 := context.WithCancel(context.Background())
		r2 := s.Stdin(ctx2, "in2")
		time.AfterFunc(50*time.Millisecond, cancel2)
		if n, err := r2.Read(make([]byte, 10)); n != 0 || err != io.EOF {
			t.Errorf("read after the end: %d, %v", n, err)
		}
	})
}

func TestStdinBudget(t *testing.T) {
	backends(t, func(t *testing.T, s *Store) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		half := make([]byte, runbox.MaxQueuedStdin/2)
		for i, want := range []error{nil, nil, runbox.ErrInputFull} {
			if err := s.SendStdin(ctx, "budget", half, false); !errors.Is(err, want) {
				t.Fatalf("send %d: %v, want %v", i, err, want)
			}
		}
		// Ending the input costs nothing.
		if err := s.SendStdin(ctx, "budget", nil, false); err != nil {
			t.Fatal(err)
		}
		// What the program reads frees its room.
		r := s.Stdin(ctx, "budget")
		if _, err := io.ReadFull(r, make([]byte, len(half))); err != nil {
			t.Fatal(err)
		}
		if err := s.SendStdin(ctx, "budget", half, true); err != nil {
			t.Errorf("after the program read: %v", err)
		}
	})
}
