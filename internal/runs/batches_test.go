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
	"github.com/runbox-dev/runbox/internal/sessions"
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
	// The client's turn let runs go (its first, then its second batch's
	// first); their tasks are asynq's.
	in := asynq.NewInspectorFromRedisClient(rdb)
	q, err := in.GetQueueInfo(queue.Name)
	if err != nil || q.Pending != 2 {
		t.Fatalf("asynq's queue: %+v, %v; want 2 pending", q, err)
	}
}

// TestBatchConcurrency: a batch past its client's concurrent runs is not
// refused: what does not fit waits, and is let go as runs start and end.
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
	if n := pending(); n != 2 {
		t.Fatalf("%d runs let go; want 2, the client's turn", n)
	}
	// Submitted alone, a run is refused as before.
	if _, err := s.Submit(ctx, runbox.Spec{Language: "bash", Code: "x"}, ""); runbox.ErrorCode(err) != runbox.ERateLimited {
		t.Fatalf("a run past the limit: %v", err)
	}
	first := created.RunIDs[0]
	run, _ := s.Get(ctx, first)
	key, _ := ConversationKey(ctx, run.ConversationID)
	// Claimed, it lets the third go (2 given and 1 running: 3 at once);
	// ended, the fourth.
	c, err := st.ClaimFor(ctx, first, "ex", time.Minute, 0)
	if err != nil || !c.OK || len(c.Dispatch) != 1 || c.Dispatch[0] != created.RunIDs[2] {
		t.Fatalf("claim: %+v, %v; want the third let go", c, err)
	}
	a, _ := st.Finish(ctx, first, runbox.Ending{From: []runbox.Status{runbox.StatusRunning}, Status: runbox.StatusSucceeded,
		Result: &runbox.Result{}, Conversation: key})
	if len(a.Dispatch) != 0 {
		t.Fatalf("the end let %v go; two are given, one more may run", a.Dispatch)
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

// TestBatchBounds: a batch is held whole to what its client may have
// waiting and spend: its queue (the service's bound, or its tier's), the
// seconds its runs' timeouts reserve of the day, the bytes of a request
// (start_batch's as POST /v1/batches'), and the service's sessions.
func TestBatchBounds(t *testing.T) {
	s, st, _ := newService(t)
	withExecutor(t, st)
	s.limits.MaxQueuedRuns = 10
	s.limits.MaxSessions = 30
	big := func(n, timeout int) BatchRequest {
		req := batchOf(n)
		for i := range req.Runs {
			req.Runs[i].TimeoutSeconds = timeout
		}
		return req
	}
	for _, tc := range []struct {
		name string
		tier clients.Tier
		req  BatchRequest
		code string
	}{
		{"past the service's queue", clients.Tier{}, big(11, 0), runbox.EBusy},
		{"within the service's queue", clients.Tier{}, big(10, 0), ""},
		{"within the tier's queue", clients.Tier{MaxQueuedRuns: 20}, big(20, 0), ""},
		{"past the day's seconds", clients.Tier{RunSecondsPerDay: 20, MaxQueuedRuns: 50}, big(12, 4), runbox.EQuotaExceeded},
		{"within the day's seconds", clients.Tier{RunSecondsPerDay: 20}, big(5, 4), ""},
		{"past the sessions", clients.Tier{MaxQueuedRuns: 50}, big(31, 0), runbox.EMaxSessions},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := s.SubmitBatch(asClient(clientName(tc.name), tc.tier), tc.req)
			if (err == nil) != (tc.code == "") || runbox.ErrorCode(err) != tc.code && tc.code != "" {
				t.Fatalf("SubmitBatch: %v; want %q", err, tc.code)
			}
		})
	}
	// The day's seconds, reserved by the batch, are held for runs
	// submitted alone too.
	ctx := asClient(clientName("within the day's seconds"), clients.Tier{RunSecondsPerDay: 20})
	if _, err := s.Submit(ctx, runbox.Spec{Language: "bash", Code: "x"}, ""); runbox.ErrorCode(err) != runbox.EQuotaExceeded {
		t.Fatalf("a run past what the batch reserved: %v", err)
	}
	// A batch's runs hold at most runbox.MaxBatchBytes, over MCP too.
	req := batchOf(runbox.MaxBatchRuns)
	for i := range req.Runs {
		req.Runs[i].Code = strings.Repeat("x", runbox.MaxBatchBytes/runbox.MaxBatchRuns+1)
	}
	if _, err := s.SubmitBatch(asClient("huge", clients.Tier{}), req); runbox.ErrorCode(err) != runbox.ETooLarge {
		t.Fatalf("a batch of %d bytes: %v", runbox.MaxBatchBytes+runbox.MaxBatchRuns, err)
	}
}

// clientName is a client's name made of a test case's.
func clientName(s string) string {
	return strings.NewReplacer(" ", "-", "'", "").Replace(s)
}

// TestBatchCancelScope: cancelling a batch from another MCP session of
// its client leaves the runs in the first session's conversation alone,
// as GetBatch leaves them out.
func TestBatchCancelScope(t *testing.T) {
	s, st, _ := newService(t)
	withExecutor(t, st)
	ctx := asClient("alice", clients.Tier{})
	a := sessions.Ref{Client: "alice", ID: strings.Repeat("A", 26)}
	b := sessions.Ref{Client: "alice", ID: strings.Repeat("B", 26)}
	req := batchOf(2)
	req.Runs[0].ConversationID = sessions.Conversation(a)
	created, err := s.SubmitBatch(sessions.With(ctx, a), req)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.CancelBatch(sessions.With(ctx, b), created.BatchID); err != nil {
		t.Fatal(err)
	}
	for i, want := range []runbox.Status{runbox.StatusQueued, runbox.StatusCancelled} {
		if run, err := st.Run(ctx, created.RunIDs[i]); err != nil || run.Status != want {
			t.Errorf("run %d: %+v, %v; want %s", i, run, err, want)
		}
	}
}
