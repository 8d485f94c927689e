package store

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/runbox-dev/runbox"
	"github.com/runbox-dev/runbox/internal/testenv"
)

// backends runs a test against miniredis and a real redis-server.
func backends(t *testing.T, f func(t *testing.T, s *Store)) {
	t.Run("miniredis", func(t *testing.T) {
		_, url := testenv.Miniredis(t)
		f(t, New(testenv.Client(t, url)))
	})
	t.Run("redis-server", func(t *testing.T) {
		f(t, New(testenv.Client(t, testenv.Redis(t))))
	})
}

func newRun(t *testing.T, s *Store, id string) {
	t.Helper()
	err := s.CreateRun(context.Background(), runbox.Run{ID: id, ConversationID: "c1", Language: "python", CreatedAt: time.Now()})
	if err != nil {
		t.Fatal(err)
	}
}

func TestRunLifecycle(t *testing.T) {
	backends(t, func(t *testing.T, s *Store) {
		ctx := context.Background()
		newRun(t, s, "r1")
		if err := s.CreateRun(ctx, runbox.Run{ID: "r1", ConversationID: "c1", CreatedAt: time.Now()}); err == nil {
			t.Error("second CreateRun of the same id succeeded")
		}
		ok, err := s.Claim(ctx, "r1", "ex1", time.Minute)
		if err != nil || !ok {
			t.Fatalf("Claim = %v, %v", ok, err)
		}
		if ok, _ := s.Claim(ctx, "r1", "ex2", time.Minute); ok {
			t.Fatal("a running run was claimed again")
		}
		if err := s.Append(ctx, "r1", runbox.Event{Type: runbox.EventStdout, Data: "hi\n"}); err != nil {
			t.Fatal(err)
		}
		code := 0
		res := &runbox.Result{Success: true, Stdout: "hi\n", RunID: "r1"}
		ok, err = s.Finish(ctx, "r1", []runbox.Status{runbox.StatusRunning}, LeaseDelete, runbox.StatusSucceeded, res,
			runbox.Event{Type: runbox.EventExit, ExitCode: &code})
		if err != nil || !ok {
			t.Fatalf("Finish = %v, %v", ok, err)
		}
		if ok, _ := s.Finish(ctx, "r1", []runbox.Status{runbox.StatusRunning}, LeaseDelete, runbox.StatusError, res); ok {
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
		if run.Status != runbox.StatusSucceeded || run.Result == nil || run.ConversationID != "c1" || run.StartedAt.IsZero() {
			t.Errorf("run record %+v", run)
		}
		if _, err := s.Run(ctx, "nope"); !errors.Is(err, ErrNotFound) {
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
		ok, _, err := s.Apply(ctx, "long", Transition{From: []runbox.Status{runbox.StatusRunning}, To: runbox.StatusError, Lease: LeaseExpired}, 0)
		if err != nil || ok {
			t.Fatalf("expired-lease transition of a live run = %v, %v", ok, err)
		}
		ok, err = s.Finish(ctx, "short", []runbox.Status{runbox.StatusRunning}, LeaseExpired, runbox.StatusError, &runbox.Result{})
		if err != nil || !ok {
			t.Fatalf("finish of an expired run = %v, %v", ok, err)
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

func TestExecutorRegistry(t *testing.T) {
	backends(t, func(t *testing.T, s *Store) {
		ctx := context.Background()
		py := runbox.Runner{Language: "python", Image: "runner-python"}
		sh := runbox.Runner{Language: "bash", Image: "runner-bash"}
		s.Heartbeat(ctx, ExecutorInfo{ID: "a", Runners: []runbox.Runner{py}}, time.Minute)
		s.Heartbeat(ctx, ExecutorInfo{ID: "b", Runners: []runbox.Runner{sh, py}}, time.Minute)
		s.Heartbeat(ctx, ExecutorInfo{ID: "gone", Runners: []runbox.Runner{{Language: "cobol"}}}, time.Millisecond)
		time.Sleep(20 * time.Millisecond)
		runners, err := s.Runners(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if fmt.Sprint(runners) != fmt.Sprint([]runbox.Runner{sh, py}) {
			t.Errorf("runners = %v", runners)
		}
		s.Unregister(ctx, "b")
		if runners, _ := s.Runners(ctx); len(runners) != 1 {
			t.Errorf("after unregister: %v", runners)
		}
	})
}

// TestWatchExactlyOnce has a writer append events while watchers join
// before, during and after; each must see every event once, in order.
func TestWatchExactlyOnce(t *testing.T) {
	backends(t, func(t *testing.T, s *Store) {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		hub := NewHub(s, slog.New(slog.DiscardHandler))
		defer hub.Close()
		newRun(t, s, "w1")
		s.Claim(ctx, "w1", "ex", time.Minute)

		const n = 300
		var wg sync.WaitGroup
		check := func(after int64) {
			defer wg.Done()
			w := hub.Watch(ctx, "w1", after)
			defer w.Close()
			want := after + 1
			for {
				ev, err := w.Next(ctx)
				if errors.Is(err, io.EOF) {
					break
				}
				if err != nil {
					t.Errorf("watch from %d: %v", after, err)
					return
				}
				if ev.Seq != want {
					t.Errorf("watch from %d: got seq %d, want %d", after, ev.Seq, want)
					return
				}
				want++
			}
			if want != n+4 { // queued, started, n outputs, done
				t.Errorf("watch from %d ended after seq %d", after, want-1)
			}
		}
		for i := range 3 {
			wg.Add(1)
			go check(int64(i))
		}
		for i := range n {
			if err := s.Append(ctx, "w1", runbox.Event{Type: runbox.EventStdout, Data: fmt.Sprint(i)}); err != nil {
				t.Fatal(err)
			}
			if i == n/2 {
				wg.Add(2)
				go check(0)
				go check(int64(i))
			}
		}
		s.Finish(ctx, "w1", nil, LeaseDelete, runbox.StatusSucceeded, &runbox.Result{})
		wg.Add(1)
		go check(5)
		wg.Wait()
	})
}
