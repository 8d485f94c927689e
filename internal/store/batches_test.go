package store

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/runbox-dev/runbox"
)

// testQueue is where the tests' batches write their tasks (asynq's layout
// is queue.Shared's, checked in internal/queue).
var testQueue = runbox.TaskQueue{Name: "runs", TaskKeyPrefix: "asynq:{runs}:t:", PendingKey: "asynq:{runs}:pending", QueuesKey: "asynq:queues"}

func testBatch(id, client string, n int) runbox.NewBatch {
	nb := runbox.NewBatch{ID: id, Client: client, CreatedAt: time.Now(), Queue: testQueue, MaxWaiting: 16}
	for i := range n {
		rid := fmt.Sprintf("run_%s_%d", id, i)
		cid := fmt.Sprintf("~%s~c%d", client, i)
		nb.Runs = append(nb.Runs, runbox.BatchRun{
			Run:  runbox.Run{ID: rid, ConversationID: cid, Language: "bash"},
			Spec: runbox.Spec{Language: "bash", Code: "echo " + rid, ConversationID: cid, TimeoutSeconds: 10},
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

// TestBatchTurnsAndCounts: a batch's runs head their conversations; the
// first dispatchAhead are given to asynq at once, the others as the
// client's runs are claimed and end, in the batch's order; the batch
// counts them as they go.
func TestBatchTurnsAndCounts(t *testing.T) {
	backends(t, func(t *testing.T, s *Store) {
		ctx := context.Background()
		nb := testBatch("batch_a", "alice", 5)
		nb.Callback = "https://hooks.example/batch"
		id, created, err := s.CreateBatch(ctx, nb)
		if err != nil || !created || id != "batch_a" {
			t.Fatalf("CreateBatch = %q, %v, %v", id, created, err)
		}
		ids, err := s.BatchRuns(ctx, id, 0, 0)
		if err != nil || len(ids) != 5 {
			t.Fatalf("BatchRuns = %v, %v", ids, err)
		}
		// Two are the client's turn: their tasks are in asynq's queue and
		// announced; three wait theirs.
		if got := tasks(t, s, ids...); !slices.Equal(got, ids[:2]) {
			t.Fatalf("tasks of %v; want the first two", got)
		}
		if n, _ := s.rdb.LLen(ctx, testQueue.PendingKey).Result(); n != 2 {
			t.Errorf("asynq's pending list holds %d", n)
		}
		if n, _ := s.rdb.LLen(ctx, wakeKey).Result(); n != 2 {
			t.Errorf("%d announced", n)
		}
		if n, _ := s.ActiveRuns(ctx, "alice"); n != 5 {
			t.Errorf("ActiveRuns = %d; want the 5 queued", n)
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

		// One starts: the next in the batch's order is let go.
		c, err := s.ClaimFor(ctx, ids[0], "ex", time.Minute, 0)
		if err != nil || !c.OK || !slices.Equal(c.Dispatch, ids[2:3]) {
			t.Fatalf("claim: %+v, %v; want %s let go", c, err, ids[2])
		}
		if b, _ := s.Batch(ctx, id); b.Running != 1 || b.Queued != 4 {
			t.Fatalf("after the claim: %+v", b)
		}
		// It ends: two are still the client's turn, none is let go.
		if a := finish(t, s, ids[0], nb.Runs[0].Run.ConversationID, runbox.StatusRunning); len(a.Dispatch) != 0 {
			t.Fatalf("the end let %v go", a.Dispatch)
		}
		if b, _ := s.Batch(ctx, id); b.Running != 0 || b.Succeeded != 1 || b.Queued != 4 {
			t.Fatalf("after the end: %+v", b)
		}

		// A waiting run cancelled is counted, and never let go.
		if _, err := s.Finish(ctx, ids[3], runbox.Ending{From: []runbox.Status{runbox.StatusQueued}, Status: runbox.StatusCancelled,
			Result: &runbox.Result{Cancelled: true}, Conversation: nb.Runs[3].Run.ConversationID}); err != nil {
			t.Fatal(err)
		}
		if a := finish(t, s, ids[1], nb.Runs[1].Run.ConversationID, runbox.StatusQueued); !slices.Equal(a.Dispatch, ids[4:]) {
			t.Fatalf("the end of %s let %v go; want %s", ids[1], a.Dispatch, ids[4])
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
		// Nothing of the client's is left counted.
		if n, _ := s.ActiveRuns(ctx, "alice"); n != 0 {
			t.Errorf("ActiveRuns = %d at the end", n)
		}
		if n, _ := s.rdb.HLen(ctx, queuedKey("alice")).Result(); n != 0 {
			t.Errorf("%d runs left in the client's queue", n)
		}
	})
}

// TestBatchConcurrentRuns: with concurrent_runs, no more of the client's
// runs are given to executors than it may run; what waits goes as they
// end.
func TestBatchConcurrentRuns(t *testing.T) {
	backends(t, func(t *testing.T, s *Store) {
		ctx := context.Background()
		nb := testBatch("batch_c", "bob", 3)
		nb.Bounds.ConcurrentRuns = 1
		if _, _, err := s.CreateBatch(ctx, nb); err != nil {
			t.Fatal(err)
		}
		ids := []string{nb.Runs[0].Run.ID, nb.Runs[1].Run.ID, nb.Runs[2].Run.ID}
		if got := tasks(t, s, ids...); !slices.Equal(got, ids[:1]) {
			t.Fatalf("tasks of %v; want the first alone", got)
		}
		if c, err := s.ClaimFor(ctx, ids[0], "ex", time.Minute, 0); err != nil || !c.OK || len(c.Dispatch) != 0 {
			t.Fatalf("claim: %+v, %v; want none let go while it runs", c, err)
		}
		if a := finish(t, s, ids[0], nb.Runs[0].Run.ConversationID, runbox.StatusRunning); !slices.Equal(a.Dispatch, ids[1:2]) {
			t.Fatalf("its end let %v go; want %s", a.Dispatch, ids[1])
		}
	})
}

// TestBatchConversationBound: a batch may leave no more runs waiting in a
// conversation than runs submitted alone may; refused, nothing is written.
func TestBatchConversationBound(t *testing.T) {
	backends(t, func(t *testing.T, s *Store) {
		ctx := context.Background()
		nb := testBatch("batch_w", "carol", 5)
		nb.MaxWaiting = 3
		for i := range nb.Runs {
			nb.Runs[i].Run.ConversationID = "~carol~one"
		}
		before, _ := s.rdb.DBSize(ctx).Result()
		if _, _, err := s.CreateBatch(ctx, nb); runbox.ErrorCode(err) != runbox.EBusy || runbox.RetryAfterSeconds(err) == 0 ||
			!strings.Contains(runbox.ErrorMessage(err), "conversation one") {
			t.Fatalf("5 runs into one conversation, 3 may wait: %v", err)
		}
		if after, _ := s.rdb.DBSize(ctx).Result(); after != before {
			t.Errorf("a refused batch left %d keys", after-before)
		}
		nb.Runs = nb.Runs[:4] // the head and three waiting
		if _, _, err := s.CreateBatch(ctx, nb); err != nil {
			t.Fatalf("4 runs into one conversation: %v", err)
		}
		if _, _, err := s.CreateRun(ctx, runbox.NewRun{Run: runbox.Run{ID: "alone", ConversationID: "~carol~one", CreatedAt: time.Now()},
			Client: "carol", MaxWaiting: 3}); !errors.Is(err, runbox.ErrBusy) {
			t.Fatalf("a fifth run alone: %v", err)
		}
	})
}

// TestBatchIdempotency: a key used before returns the earlier batch.
func TestBatchIdempotency(t *testing.T) {
	backends(t, func(t *testing.T, s *Store) {
		ctx := context.Background()
		nb := testBatch("batch_k1", "carol", 1)
		nb.IdempotencyKey = "k"
		if _, _, err := s.CreateBatch(ctx, nb); err != nil {
			t.Fatal(err)
		}
		other := testBatch("batch_k2", "carol", 1)
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
