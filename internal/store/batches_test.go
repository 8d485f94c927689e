package store

import (
	"context"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/runbox-dev/runbox"
)

// testQueue is where the tests' batches write their tasks (asynq's layout
// is queue.Shared's, checked in internal/queue).
var testQueue = runbox.TaskQueue{Name: "runs", TaskKeyPrefix: "asynq:{runs}:t:", PendingKey: "asynq:{runs}:pending", QueuesKey: "asynq:queues"}

func testBatch(id, client string, n int, window int) runbox.NewBatch {
	nb := runbox.NewBatch{ID: id, Client: client, CreatedAt: time.Now(), Window: window, Queue: testQueue}
	for i := range n {
		rid := fmt.Sprintf("run_%s_%d", id, i)
		cid := fmt.Sprintf("~%s~c%d", client, i)
		nb.Runs = append(nb.Runs, runbox.BatchRun{
			Run:  runbox.Run{ID: rid, ConversationID: cid, Language: "bash"},
			Spec: runbox.Spec{Language: "bash", Code: "echo " + rid, ConversationID: cid},
			Task: []byte("task of " + rid),
		})
	}
	return nb
}

// tasks returns the ids of the runs whose asynq task exists, of ids.
func tasks(t *testing.T, s *Store, ids ...string) []string {
	t.Helper()
	var out []string
	for _, id := range ids {
		if n, _ := s.rdb.Exists(context.Background(), testQueue.TaskKeyPrefix+id).Result(); n == 1 {
			out = append(out, id)
		}
	}
	return out
}

func TestBatchWindowAndCounts(t *testing.T) {
	backends(t, func(t *testing.T, s *Store) {
		ctx := context.Background()
		nb := testBatch("batch_a", "alice", 5, 2)
		nb.Callback = "https://hooks.example/batch"
		id, created, err := s.CreateBatch(ctx, nb)
		if err != nil || !created || id != "batch_a" {
			t.Fatalf("CreateBatch = %q, %v, %v", id, created, err)
		}
		ids, err := s.BatchRuns(ctx, id, 0, 0)
		if err != nil || len(ids) != 5 {
			t.Fatalf("BatchRuns = %v, %v", ids, err)
		}
		// Two fit in the window: they head their conversations, their
		// tasks are in asynq's queue and announced; three wait.
		if got := tasks(t, s, ids...); !slices.Equal(got, ids[:2]) {
			t.Fatalf("tasks of %v; want the first two", got)
		}
		if n, _ := s.rdb.LLen(ctx, testQueue.PendingKey).Result(); n != 2 {
			t.Errorf("asynq's pending list holds %d", n)
		}
		if n, _ := s.rdb.LLen(ctx, wakeKey).Result(); n != 2 {
			t.Errorf("%d announced", n)
		}
		if n, _ := s.ActiveRuns(ctx, "alice"); n != 2 {
			t.Errorf("ActiveRuns = %d; want the two let in", n)
		}
		for _, rid := range ids {
			run, err := s.Run(ctx, rid)
			if err != nil || run.Status != runbox.StatusQueued {
				t.Fatalf("run %s: %+v, %v", rid, run, err)
			}
			evs, _ := s.Events(ctx, rid, 0)
			if len(evs) != 1 || evs[0].Type != runbox.EventQueued || evs[0].Seq != 1 {
				t.Fatalf("events of %s: %+v", rid, evs)
			}
		}
		b, err := s.Batch(ctx, id)
		if err != nil || b.Total != 5 || b.Queued != 5 || b.Client != "alice" || b.Callback != nb.Callback {
			t.Fatalf("Batch = %+v, %v", b, err)
		}

		// The same id again is the same batch.
		if again, created, err := s.CreateBatch(ctx, nb); err != nil || created || again != id {
			t.Fatalf("CreateBatch again = %q, %v, %v", again, created, err)
		}

		// One starts, then ends: its place goes to the next in the gate.
		if c, err := s.ClaimFor(ctx, ids[0], "ex", time.Minute, 0); err != nil || !c.OK {
			t.Fatalf("claim: %+v, %v", c, err)
		}
		if b, _ := s.Batch(ctx, id); b.Running != 1 || b.Queued != 4 {
			t.Fatalf("after the claim: %+v", b)
		}
		finish(t, s, ids[0], nb.Runs[0].Run.ConversationID, runbox.StatusRunning)
		if b, _ := s.Batch(ctx, id); b.Running != 0 || b.Succeeded != 1 || b.Queued != 4 {
			t.Fatalf("after the end: %+v", b)
		}
		if got := tasks(t, s, ids...); !slices.Equal(got, ids[:3]) {
			t.Fatalf("tasks of %v; want the first three", got)
		}

		// A waiting run cancelled is counted, and never let in.
		if _, err := s.Finish(ctx, ids[3], runbox.Ending{From: []runbox.Status{runbox.StatusQueued}, Status: runbox.StatusCancelled,
			Result: &runbox.Result{Cancelled: true}, Conversation: nb.Runs[3].Run.ConversationID}); err != nil {
			t.Fatal(err)
		}
		finish(t, s, ids[1], nb.Runs[1].Run.ConversationID, runbox.StatusQueued)
		if got := tasks(t, s, ids...); !slices.Equal(got, []string{ids[0], ids[1], ids[2], ids[4]}) {
			t.Fatalf("tasks of %v", got)
		}
		if b, _ := s.Batch(ctx, id); b.Cancelled != 1 || b.Succeeded != 2 || b.Queued != 2 || !b.FinishedAt.IsZero() {
			t.Fatalf("before the last: %+v", b)
		}
		if out, _ := s.Outbox(ctx, 10); len(out) != 0 {
			t.Fatalf("outbox before the batch ended: %v", out)
		}
		for _, i := range []int{2, 4} {
			if _, err := s.Finish(ctx, ids[i], runbox.Ending{From: []runbox.Status{runbox.StatusQueued}, Status: runbox.StatusTimedOut,
				Result: &runbox.Result{}, Conversation: nb.Runs[i].Run.ConversationID}); err != nil {
				t.Fatal(err)
			}
		}
		b, _ = s.Batch(ctx, id)
		if !b.Done() || b.Failed != 2 || b.Queued != 0 || b.FinishedAt.IsZero() {
			t.Fatalf("at the end: %+v", b)
		}
		// Its webhook is in the outbox.
		want := runbox.WebhookID(id, runbox.WebhookBatchCompleted)
		if out, _ := s.Outbox(ctx, 10); !slices.Equal(out, []string{want}) {
			t.Fatalf("outbox = %v; want %s", out, want)
		}
		w, err := s.Webhook(ctx, want)
		if err != nil || w.Subject != id || w.Type != runbox.WebhookBatchCompleted || w.URL != nb.Callback ||
			w.Client != "alice" || w.State != runbox.WebhookPending {
			t.Fatalf("webhook %+v, %v", w, err)
		}
		if runs, err := s.RunsOf(ctx, ids[:2]); err != nil || len(runs) != 2 || runs[0].ID != ids[0] || runs[1].Status != runbox.StatusSucceeded {
			t.Fatalf("RunsOf = %+v, %v", runs, err)
		}
	})
}

// TestBatchGateOrder: runs of a later batch wait behind an earlier
// batch's, and a batch being cancelled lets none of its waiting runs in.
func TestBatchGateOrder(t *testing.T) {
	backends(t, func(t *testing.T, s *Store) {
		ctx := context.Background()
		first := testBatch("batch_1", "bob", 3, 1)
		if _, _, err := s.CreateBatch(ctx, first); err != nil {
			t.Fatal(err)
		}
		second := testBatch("batch_2", "bob", 2, 5)
		for i := range second.Runs {
			second.Runs[i].Run.ConversationID += "-2"
		}
		if _, _, err := s.CreateBatch(ctx, second); err != nil {
			t.Fatal(err)
		}
		if got := tasks(t, s, "run_batch_2_0", "run_batch_2_1"); len(got) != 0 {
			t.Fatalf("the second batch jumped the gate: %v", got)
		}
		// The sweep lets in what the window (now 5) leaves room for, in
		// order — but none of a batch being cancelled.
		if err := s.CancellingBatch(ctx, "batch_1"); err != nil {
			t.Fatal(err)
		}
		n, err := s.ReleaseGated(ctx)
		if err != nil || n != 2 {
			t.Fatalf("ReleaseGated = %d, %v", n, err)
		}
		if got := tasks(t, s, "run_batch_1_1", "run_batch_1_2", "run_batch_2_0", "run_batch_2_1"); !slices.Equal(got, []string{"run_batch_2_0", "run_batch_2_1"}) {
			t.Fatalf("let in %v", got)
		}
		if m, _ := s.rdb.SIsMember(ctx, gatesKey, "bob").Result(); m {
			t.Error("bob's gate is empty and still listed")
		}
		if err := s.CancellingBatch(ctx, "batch_none"); err != runbox.ErrBatchNotFound {
			t.Errorf("CancellingBatch of nothing: %v", err)
		}
	})
}

// TestBatchIdempotency: a key used before returns the earlier batch.
func TestBatchIdempotency(t *testing.T) {
	backends(t, func(t *testing.T, s *Store) {
		ctx := context.Background()
		nb := testBatch("batch_k1", "carol", 1, 0)
		nb.IdempotencyKey = "k"
		if _, _, err := s.CreateBatch(ctx, nb); err != nil {
			t.Fatal(err)
		}
		other := testBatch("batch_k2", "carol", 1, 0)
		other.IdempotencyKey = "k"
		id, created, err := s.CreateBatch(ctx, other)
		if err != nil || created || id != "batch_k1" {
			t.Fatalf("CreateBatch with a used key = %q, %v, %v", id, created, err)
		}
		if _, err := s.Run(ctx, "run_batch_k2_0"); err != runbox.ErrRunNotFound {
			t.Fatalf("a run of the refused batch was recorded: %v", err)
		}
	})
}
