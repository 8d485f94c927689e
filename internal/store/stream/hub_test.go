package stream_test

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
	"github.com/runbox-dev/runbox/internal/store"
	"github.com/runbox-dev/runbox/internal/store/stream"
	"github.com/runbox-dev/runbox/internal/testenv"
)

// backends runs a test against miniredis and a real redis-server.
func backends(t *testing.T, f func(t *testing.T, conn *store.Conn)) {
	t.Run("miniredis", func(t *testing.T) {
		_, url := testenv.Miniredis(t)
		f(t, store.NewConn(testenv.Client(t, url)))
	})
	t.Run("redis-server", func(t *testing.T) {
		f(t, store.NewConn(testenv.Client(t, testenv.Redis(t))))
	})
}

// TestWatchExactlyOnce has a writer append events while watchers join
// before, during and after; each must see every event once, in order,
// and the done event with the run's result.
func TestWatchExactlyOnce(t *testing.T) {
	backends(t, func(t *testing.T, conn *store.Conn) {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		s := store.New(conn)
		hub := stream.NewHub(conn, s, slog.New(slog.DiscardHandler))
		defer hub.Close()
		const id, cid = "w1", "c-w1"
		if _, _, err := s.CreateRun(ctx, runbox.NewRun{
			Run:        runbox.Run{ID: id, ConversationID: cid, Language: "python", CreatedAt: time.Now()},
			Spec:       runbox.Spec{Language: "python", Code: "print(1)", ConversationID: cid},
			MaxWaiting: 1,
		}); err != nil {
			t.Fatal(err)
		}
		if ok, err := s.Claim(ctx, id, "ex", time.Minute); err != nil || !ok {
			t.Fatalf("Claim = %v, %v", ok, err)
		}

		const n = 300
		var wg sync.WaitGroup
		check := func(after int64) {
			defer wg.Done()
			w := hub.Watch(ctx, id, after)
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
				if ev.Type == runbox.EventDone && (ev.Result == nil || ev.Result.Stdout != "out") {
					t.Errorf("watch from %d: done event's result = %+v", after, ev.Result)
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
			if err := s.Append(ctx, id, runbox.Event{Type: runbox.EventStdout, Data: fmt.Sprint(i)}); err != nil {
				t.Fatal(err)
			}
			if i == n/2 {
				wg.Add(2)
				go check(0)
				go check(int64(i))
			}
		}
		if _, err := s.Finish(ctx, id, runbox.Ending{From: []runbox.Status{runbox.StatusRunning}, Lease: runbox.LeaseDelete,
			Status: runbox.StatusSucceeded, Result: &runbox.Result{Stdout: "out"}, Conversation: cid}); err != nil {
			t.Fatal(err)
		}
		wg.Add(1)
		go check(5)
		wg.Wait()
	})
}
