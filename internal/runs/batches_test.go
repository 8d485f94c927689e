package runs

import (
	"context"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/runbox-dev/runbox"
	"github.com/runbox-dev/runbox/internal/auth"
	"github.com/runbox-dev/runbox/internal/clients"
	"github.com/runbox-dev/runbox/internal/queue"
	"github.com/runbox-dev/runbox/internal/store"
)

// roundTrips counts the round trips made to Redis on a client by calls
// whose context was marked by counted: the hub's own subscription shares
// the client, and its reconnections are not the batch's.
type roundTrips struct{ n atomic.Int64 }

type countedKey struct{}

func counted(ctx context.Context) context.Context { return context.WithValue(ctx, countedKey{}, true) }

func (r *roundTrips) count(ctx context.Context) {
	if ctx.Value(countedKey{}) != nil {
		r.n.Add(1)
	}
}

func (r *roundTrips) DialHook(next redis.DialHook) redis.DialHook { return next }
func (r *roundTrips) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error { r.count(ctx); return next(ctx, cmd) }
}
func (r *roundTrips) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error { r.count(ctx); return next(ctx, cmds) }
}

var _ redis.Hook = (*roundTrips)(nil)

// callbacks accepts callbacks to https://ok.example/ only.
type callbacks struct{}

func (callbacks) Callback(_ context.Context, _, url string, fallback bool) (runbox.Callback, error) {
	switch {
	case url == "" && fallback:
		return runbox.Callback{URL: "https://default.example/"}, nil
	case url == "" || url == "https://ok.example/":
		return runbox.Callback{URL: url}, nil
	}
	return runbox.Callback{}, runbox.Errorf(runbox.EInvalid, "callback_url: %s is not allowed", url)
}

func (c callbacks) Callbacks(ctx context.Context, client string, urls []string) ([]runbox.Callback, []error) {
	cbs, errs := make([]runbox.Callback, len(urls)), make([]error, len(urls))
	for i, u := range urls {
		cbs[i], errs[i] = c.Callback(ctx, client, u, false)
	}
	return cbs, errs
}

func (callbacks) Admit(context.Context, string, int) error { return nil }

func batchOf(n int) BatchRequest {
	req := BatchRequest{}
	for i := range n {
		req.Runs = append(req.Runs, StartRequest{Request: Request{Language: "bash", Code: fmt.Sprintf("echo %d", i)}})
	}
	return req
}

func asClient(name string, tier clients.Tier) context.Context {
	return auth.WithClient(context.Background(), clients.Client{Name: name, Tier: tier})
}

func withExecutor(t *testing.T, st *store.Store) {
	t.Helper()
	if err := st.Heartbeat(context.Background(), runbox.ExecutorInfo{ID: "ex", Concurrency: 2,
		Runners: []runbox.Runner{{Language: "bash"}, {Language: "python"}}}, time.Hour); err != nil {
		t.Fatal(err)
	}
}

// TestBatchOneBadRun: a batch of 1000 with one bad run is refused as a
// whole, naming the run, and nothing of it is recorded or enqueued.
func TestBatchOneBadRun(t *testing.T) {
	s, st, rdb := newService(t)
	s.Callbacks = callbacks{}
	ctx := asClient("alice", clients.Tier{})
	if _, err := s.SubmitBatch(ctx, batchOf(2)); runbox.ErrorCode(err) != runbox.EUnavailable {
		t.Fatalf("with no executor: %v", err)
	}
	withExecutor(t, st)
	before, _ := rdb.DBSize(ctx).Result()
	for _, bad := range []struct {
		run  StartRequest
		want string
	}{
		{StartRequest{Request: Request{Language: "bash", Code: " "}}, "runs[617]: code is empty"},
		{StartRequest{Request: Request{Language: "cobol", Code: "x"}}, `runs[617]: unknown language "cobol"`},
		{StartRequest{Request: Request{Language: "bash", Code: "x", ConversationID: "../x"}}, "runs[617]: conversationId"},
		{StartRequest{Request: Request{Language: "bash", Code: "x", CallbackURL: "https://127.0.0.1/"}}, "runs[617]: callback_url"},
		{StartRequest{Request: Request{Language: "bash", Code: "x", IdempotencyKey: "k"}}, "runs[617]: idempotency_key"},
		{StartRequest{Request: Request{Language: "bash", Code: strings.Repeat("x", 101)}}, "runs[617]: code is 101 bytes"},
		{StartRequest{Request: Request{Language: "bash", Code: "x", Secrets: []string{"openai"}}}, `runs[617]: secret "openai"`},
	} {
		req := batchOf(1000)
		req.Runs[617] = bad.run
		_, err := s.SubmitBatch(ctx, req)
		if runbox.ErrorCode(err) != runbox.EInvalid || !strings.HasPrefix(runbox.ErrorMessage(err), bad.want) {
			t.Errorf("SubmitBatch with %+v: %v; want invalid_argument %q", bad.run, err, bad.want)
		}
	}
	if after, _ := rdb.DBSize(ctx).Result(); after != before {
		t.Errorf("refused batches left %d keys", after-before)
	}
	if _, err := s.SubmitBatch(ctx, batchOf(runbox.MaxBatchRuns+1)); runbox.ErrorCode(err) != runbox.EInvalid {
		t.Errorf("a batch too large: %v", err)
	}
	if _, err := s.SubmitBatch(ctx, BatchRequest{}); runbox.ErrorCode(err) != runbox.EInvalid {
		t.Errorf("an empty batch: %v", err)
	}
}

// TestBatchOneRound: a batch is recorded and enqueued in a few round
// trips to Redis, whatever its size — not one per run.
func TestBatchOneRound(t *testing.T) {
	s, st, rdb := newService(t)
	withExecutor(t, st)
	rt := &roundTrips{}
	rdb.AddHook(rt)
	ctx := counted(asClient("alice", clients.Tier{}))
	for _, n := range []int{1, 1000} {
		before := rt.n.Load()
		created, err := s.SubmitBatch(ctx, batchOf(n))
		if err != nil || len(created.RunIDs) != n {
			t.Fatalf("SubmitBatch(%d) = %d runs, %v", n, len(created.RunIDs), err)
		}
		if trips := rt.n.Load() - before; trips == 0 || trips > 6 {
			t.Errorf("a batch of %d took %d round trips", n, trips)
		}
	}
	// The window (at least 64) let runs in; their tasks are asynq's.
	in := asynq.NewInspectorFromRedisClient(rdb)
	q, err := in.GetQueueInfo(queue.Name)
	if err != nil || q.Pending != minWindow {
		t.Fatalf("asynq's queue: %+v, %v; want %d pending", q, err, minWindow)
	}
}

// TestBatchConcurrency: a batch past its client's concurrent runs is not
// refused: what does not fit waits, and is let in as runs end.
func TestBatchConcurrency(t *testing.T) {
	s, st, rdb := newService(t)
	withExecutor(t, st)
	ctx := asClient("bob", clients.Tier{ConcurrentRuns: 3})
	created, err := s.SubmitBatch(ctx, batchOf(10))
	if err != nil {
		t.Fatal(err)
	}
	in := asynq.NewInspectorFromRedisClient(rdb)
	pending := func() int {
		q, err := in.GetQueueInfo(queue.Name)
		if err != nil {
			t.Fatal(err)
		}
		return q.Pending
	}
	if n := pending(); n != 3 {
		t.Fatalf("%d runs let in; want 3", n)
	}
	// Submitted alone, a run is refused as before.
	if _, err := s.Submit(ctx, runbox.Spec{Language: "bash", Code: "x"}, ""); runbox.ErrorCode(err) != runbox.ERateLimited {
		t.Fatalf("a run past the limit: %v", err)
	}
	first := created.RunIDs[0]
	run, _ := s.Get(ctx, first)
	key, _ := ConversationKey(ctx, run.ConversationID)
	if ok, err := st.Claim(ctx, first, "ex", time.Minute); !ok || err != nil {
		t.Fatal(ok, err)
	}
	st.Finish(ctx, first, runbox.Ending{From: []runbox.Status{runbox.StatusRunning}, Status: runbox.StatusSucceeded,
		Result: &runbox.Result{}, Conversation: key})
	// (No worker here: the ended run's task is still pending too.)
	if n := pending(); n != 4 {
		t.Fatalf("after one ended, %d pending; want the 3 first and 1 let in", n)
	}
	b, err := s.Batch(ctx, created.BatchID)
	if err != nil || b.Succeeded != 1 || b.Queued != 9 || b.Total != 10 {
		t.Fatalf("Batch = %+v, %v", b, err)
	}
}

// TestBatchTierLimits: a batch's new conversations count against the
// client's hour all at once.
func TestBatchTierLimits(t *testing.T) {
	s, st, _ := newService(t)
	withExecutor(t, st)
	ctx := asClient("carol", clients.Tier{NewConversationsPerHour: 5})
	if _, err := s.SubmitBatch(ctx, batchOf(6)); runbox.ErrorCode(err) != runbox.ERateLimited {
		t.Fatalf("6 new conversations: %v", err)
	}
	if _, err := s.SubmitBatch(ctx, batchOf(5)); err != nil {
		t.Fatalf("5 new conversations: %v", err)
	}
	if _, err := s.SubmitBatch(ctx, batchOf(1)); runbox.ErrorCode(err) != runbox.ERateLimited {
		t.Fatalf("a sixth: %v", err)
	}
	// Runs of one conversation count once.
	req := batchOf(3)
	for i := range req.Runs {
		req.Runs[i].ConversationID = "fresh"
	}
	if _, err := s.SubmitBatch(asClient("dave", clients.Tier{NewConversationsPerHour: 1}), req); err != nil {
		t.Fatalf("3 runs of one new conversation: %v", err)
	}
}

// TestBatchPagesAndCancel: a batch's runs come in pages, to its client
// only; cancelled, none of what waited starts.
func TestBatchPagesAndCancel(t *testing.T) {
	s, st, _ := newService(t)
	withExecutor(t, st)
	ctx := asClient("erin", clients.Tier{ConcurrentRuns: 2})
	req := batchOf(250)
	created, err := s.SubmitBatch(ctx, req)
	if err != nil {
		t.Fatal(err)
	}
	var seen []string
	cursor := ""
	for pages := 0; ; pages++ {
		p, err := s.GetBatch(ctx, created.BatchID, cursor, 0)
		if err != nil || p.Total != 250 || p.Queued != 250 {
			t.Fatalf("page %d: %+v, %v", pages, p.Batch, err)
		}
		for _, r := range p.Runs {
			seen = append(seen, r.ID)
			if strings.HasPrefix(r.ConversationID, "~") {
				t.Fatalf("a run's conversation as the service keys it: %q", r.ConversationID)
			}
		}
		if cursor = p.NextCursor; cursor == "" {
			break
		}
	}
	if strings.Join(seen, ",") != strings.Join(created.RunIDs, ",") {
		t.Fatalf("pages hold %d runs, not the batch's in order", len(seen))
	}
	if _, err := s.GetBatch(asClient("frank", clients.Tier{}), created.BatchID, "", 0); runbox.ErrorCode(err) != runbox.ENotFound {
		t.Errorf("another client's batch: %v", err)
	}
	if _, err := s.GetBatch(ctx, created.BatchID, "x", 0); runbox.ErrorCode(err) != runbox.EInvalid {
		t.Errorf("a bad cursor: %v", err)
	}
	if _, err := s.GetBatch(ctx, created.BatchID, "", MaxBatchPage+1); runbox.ErrorCode(err) != runbox.EInvalid {
		t.Errorf("a page too large: %v", err)
	}

	// One runs; the batch is cancelled.
	first := created.RunIDs[0]
	if ok, err := st.Claim(ctx, first, "ex", time.Minute); !ok || err != nil {
		t.Fatal(ok, err)
	}
	b, err := s.CancelBatch(ctx, created.BatchID)
	if err != nil || b.Cancelled != 249 || b.Running != 1 {
		t.Fatalf("CancelBatch = %+v, %v", b, err)
	}
	if flagged, _ := st.CancelRequested(ctx, first); len(flagged) != 1 {
		t.Errorf("the running run was not asked to stop")
	}
	for _, id := range created.RunIDs[1:] {
		if run, _ := s.Get(ctx, id); run.Status != runbox.StatusCancelled {
			t.Fatalf("run %s is %s", id, run.Status)
		}
	}
}
