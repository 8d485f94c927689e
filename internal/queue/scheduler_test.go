package queue

import (
	"context"
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/hibiken/asynq"

	"github.com/runbox-dev/runbox"
	"github.com/runbox-dev/runbox/internal/store"
	"github.com/runbox-dev/runbox/internal/testenv"
)

// TestSweepRepairsHandOver: a conversation whose head ended without the
// next run being enqueued (the process died in between) moves on, and a
// head that was never enqueued is.
func TestSweepRepairsHandOver(t *testing.T) {
	_, url := testenv.Miniredis(t)
	rdb := testenv.Client(t, url)
	conn := store.NewConn(rdb)
	st := store.New(conn)
	q := NewClient(conn)
	sched := NewScheduler(st, q, slog.New(slog.DiscardHandler))
	ctx := context.Background()
	old := time.Now().Add(-time.Minute)
	create := func(id, cid string) {
		_, _, err := st.CreateRun(ctx, runbox.NewRun{
			Run:        runbox.Run{ID: id, ConversationID: cid, Language: "bash", CreatedAt: old},
			Spec:       runbox.Spec{Language: "bash", Code: "true", ConversationID: cid, TimeoutSeconds: 5},
			MaxWaiting: 4,
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	create("a1", "conv-a") // head, its end recorded without the hand-over
	create("a2", "conv-a") // waits behind it
	create("b1", "conv-b") // head, never enqueued
	st.Apply(ctx, "a1", store.Transition{To: runbox.StatusSucceeded}, 0)

	sched.Sweep(ctx)
	insp := asynq.NewInspectorFromRedisClient(rdb)
	for _, id := range []string{"a2", "b1"} {
		if _, err := insp.GetTaskInfo(Name, id); err != nil {
			t.Errorf("run %s was not enqueued: %v", id, err)
		}
	}
	if _, err := insp.GetTaskInfo(Name, "a1"); err == nil {
		t.Error("the ended head was enqueued")
	}
	// A second sweep changes nothing: two heads are queued and given.
	sched.Sweep(ctx)
	if heads, _ := st.StaleHeads(ctx, time.Now()); len(heads) != 2 || heads[0].Ended || heads[1].Ended {
		t.Errorf("heads %v", heads)
	}
}

// TestSweepReplacesArchivedHead: a head whose task failed between dequeue
// and claim (asynq archives it: runs are never retried) is still queued in
// the store; the sweep replaces the dead task instead of leaving the
// conversation waiting behind it forever.
func TestSweepReplacesArchivedHead(t *testing.T) {
	url := testenv.Redis(t)
	rdb := testenv.Client(t, url)
	conn := store.NewConn(rdb)
	st := store.New(conn)
	q := NewClient(conn)
	sched := NewScheduler(st, q, slog.New(slog.DiscardHandler))
	ctx := context.Background()
	_, _, err := st.CreateRun(ctx, runbox.NewRun{
		Run:        runbox.Run{ID: "stuck", ConversationID: "conv", Language: "bash", CreatedAt: time.Now().Add(-time.Minute)},
		Spec:       runbox.Spec{Language: "bash", Code: "true", ConversationID: "conv", TimeoutSeconds: 5},
		MaxWaiting: 4,
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := sched.Enqueue(ctx, "stuck"); err != nil {
		t.Fatal(err)
	}
	deliveries := make(chan int, 4)
	n := 0
	srv := asynq.NewServerFromRedisClient(rdb, asynq.Config{Concurrency: 1, Queues: map[string]int{Name: 1},
		TaskCheckInterval: 10 * time.Millisecond, LogLevel: asynq.FatalLevel})
	mux := asynq.NewServeMux()
	mux.HandleFunc(TypeRun, func(context.Context, *asynq.Task) error {
		n++
		deliveries <- n
		if n == 1 {
			return errors.New("injected: the executor failed before it claimed the run")
		}
		return nil
	})
	if err := srv.Start(mux); err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown()
	<-deliveries
	insp := asynq.NewInspectorFromRedisClient(rdb)
	waitState(t, insp, "stuck", asynq.TaskStateArchived)

	sched.Sweep(ctx)
	select {
	case <-deliveries:
	case <-time.After(10 * time.Second):
		t.Fatal("the archived head was not enqueued again")
	}
	// A task that is waiting or running is left alone.
	if _, err := q.Enqueue(ctx, "stuck", 5*time.Second, Name); err != nil {
		t.Errorf("enqueue while handled: %v", err)
	}
}

func waitState(t *testing.T, insp *asynq.Inspector, id string, want asynq.TaskState) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		info, err := insp.GetTaskInfo(Name, id)
		if err == nil && info.State == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("task %s: %v, %v; want %v", id, info, err, want)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// TestEnqueueFollowsOwner: a conversation's run goes to the queue of the
// executor that holds its sandbox while that executor lives, announced to
// it alone; to the shared queue otherwise, and when its owner died while
// it waited, Sweep moves it there.
func TestEnqueueFollowsOwner(t *testing.T) {
	_, url := testenv.Miniredis(t)
	rdb := testenv.Client(t, url)
	conn := store.NewConn(rdb)
	st := store.New(conn)
	q := NewClient(conn)
	insp := asynq.NewInspectorFromRedisClient(rdb)
	sched := NewScheduler(st, q, slog.New(slog.DiscardHandler))
	ctx := context.Background()
	create := func(id, cid string) {
		_, _, err := st.CreateRun(ctx, runbox.NewRun{
			Run:        runbox.Run{ID: id, ConversationID: cid, Language: "bash", CreatedAt: time.Now().Add(-time.Minute)},
			Spec:       runbox.Spec{Language: "bash", Code: "true", ConversationID: cid, TimeoutSeconds: 5},
			MaxWaiting: 4,
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	if err := st.Heartbeat(ctx, runbox.ExecutorInfo{ID: "e1"}, time.Minute); err != nil {
		t.Fatal(err)
	}
	st.SetOwner(ctx, "owned", "e1", time.Minute)
	st.SetOwner(ctx, "orphan", "e-dead", time.Minute)
	tests := []struct{ run, conv, queue, announcedTo string }{
		{"r-owned", "owned", ExecutorQueue("e1"), "e1"},
		{"r-orphan", "orphan", Name, "e2"},
		{"r-new", "new", Name, "e2"},
	}
	for _, tt := range tests {
		create(tt.run, tt.conv)
		if err := sched.Enqueue(ctx, tt.run); err != nil {
			t.Fatal(err)
		}
		if _, err := insp.GetTaskInfo(tt.queue, tt.run); err != nil {
			t.Errorf("%s is not in %s: %v", tt.run, tt.queue, err)
		}
		if id, _ := st.AwaitWake(ctx, time.Second, tt.announcedTo, true); id != tt.run {
			t.Errorf("%s was not announced to %s (got %q)", tt.run, tt.announcedTo, id)
		}
	}
	// The owner dies with the run waiting in its queue: the sweep enqueues
	// it for anyone.
	st.Unregister(ctx, "e1")
	sched.Sweep(ctx)
	if _, err := insp.GetTaskInfo(Name, "r-owned"); err != nil {
		t.Errorf("a run stranded in a dead executor's queue was not enqueued again: %v", err)
	}
}

// TestSweepEnqueuesParallelRuns: a parallel run whose enqueueing was lost
// is enqueued by the sweep once it is older than sweepAge — for the
// executor its conversation's live runs are on — and one that is no longer
// queued is forgotten.
func TestSweepEnqueuesParallelRuns(t *testing.T) {
	_, url := testenv.Miniredis(t)
	rdb := testenv.Client(t, url)
	conn := store.NewConn(rdb)
	st := store.New(conn)
	sched := NewScheduler(st, NewClient(conn), slog.New(slog.DiscardHandler))
	ctx := context.Background()
	create := func(id string, at time.Time) {
		_, _, err := st.CreateRun(ctx, runbox.NewRun{
			Run:      runbox.Run{ID: id, ConversationID: "conv", Language: "shell", CreatedAt: at},
			Spec:     runbox.Spec{Language: "shell", Code: "true", ConversationID: "conv", TimeoutSeconds: 5, Parallel: true},
			Parallel: true,
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	old := time.Now().Add(-time.Minute)
	create("live", old)
	create("lost", old)
	create("cancelled", old)
	create("young", time.Now())
	st.Heartbeat(ctx, runbox.ExecutorInfo{ID: "ex1"}, time.Minute)
	if c, err := st.ClaimFor(ctx, "live", "ex1", time.Minute, 0); err != nil || !c.OK {
		t.Fatalf("claim: %+v %v", c, err)
	}
	st.Finish(ctx, "cancelled", runbox.Ending{From: []runbox.Status{runbox.StatusQueued}, Status: runbox.StatusCancelled,
		Result: &runbox.Result{}, Conversation: "conv"})

	sched.Sweep(ctx)
	insp := asynq.NewInspectorFromRedisClient(rdb)
	if _, err := insp.GetTaskInfo(ExecutorQueue("ex1"), "lost"); err != nil {
		t.Errorf("the lost run was not enqueued for ex1: %v", err)
	}
	for _, id := range []string{"cancelled", "young"} {
		if _, err := insp.GetTaskInfo(Name, id); err == nil {
			t.Errorf("run %s was enqueued", id)
		}
	}
	stale, _ := st.StaleParallel(ctx, time.Now().Add(time.Hour), 10)
	if len(stale) != 2 || stale[0] != "lost" || stale[1] != "young" {
		t.Errorf("remembered %v, want [lost young]", stale)
	}
}
