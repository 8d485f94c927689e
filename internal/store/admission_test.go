package store

import (
	"context"
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/runbox-dev/runbox"
	"github.com/runbox-dev/runbox/internal/testenv"
)

// submit records a run of client in a conversation of its own, with
// bounds b and code of size bytes.
func submit(s *Store, client, id string, b runbox.ClientBounds, code, timeout int) (runbox.Admission, error) {
	cid := "~" + client + "~c-" + id
	adm, _, err := s.CreateRun(context.Background(), runbox.NewRun{
		Run:    runbox.Run{ID: id, ConversationID: cid, Language: "bash", CreatedAt: time.Now()},
		Spec:   runbox.Spec{Language: "bash", Code: strings.Repeat("x", code), ConversationID: cid, TimeoutSeconds: timeout},
		Client: client, MaxWaiting: 16, Bounds: b,
	})
	return adm, err
}

// TestClientQueueBounds: a client's runs waiting to start are bounded in
// number and in bytes, single runs and batches alike; past a bound the
// run (or the whole batch) is refused busy, with a time to retry, and
// nothing is written; a run that starts makes room.
func TestClientQueueBounds(t *testing.T) {
	backends(t, func(t *testing.T, s *Store) {
		ctx := context.Background()
		b := runbox.ClientBounds{MaxQueuedRuns: 3}
		for i := range 3 {
			if _, err := submit(s, "alice", fmt.Sprint("r", i), b, 10, 10); err != nil {
				t.Fatal(err)
			}
		}
		before, _ := s.rdb.DBSize(ctx).Result()
		_, err := submit(s, "alice", "r3", b, 10, 10)
		if runbox.ErrorCode(err) != runbox.EBusy || runbox.RetryAfterSeconds(err) == 0 ||
			!strings.Contains(runbox.ErrorMessage(err), "3 runs waiting") {
			t.Fatalf("a fourth run waiting: %v", err)
		}
		nb := testBatch("batch_q", "alice", 1)
		nb.Bounds = b
		if _, _, err := s.CreateBatch(ctx, nb); runbox.ErrorCode(err) != runbox.EBusy {
			t.Fatalf("a batch past the bound: %v", err)
		}
		if after, _ := s.rdb.DBSize(ctx).Result(); after != before {
			t.Errorf("refusals left %d keys", after-before)
		}
		// Another client is not held by alice's bound.
		if _, err := submit(s, "bob", "b0", b, 10, 10); err != nil {
			t.Fatalf("another client: %v", err)
		}
		// One of alice's starts: one more may wait.
		if c, err := s.ClaimFor(ctx, "r0", "ex", time.Minute, 0); err != nil || !c.OK {
			t.Fatalf("claim: %+v, %v", c, err)
		}
		if _, err := submit(s, "alice", "r3", b, 10, 10); err != nil {
			t.Fatalf("after a claim: %v", err)
		}

		// Bytes: the run's spec and its record's overhead.
		bytes := runbox.ClientBounds{MaxQueuedBytes: 3 * (4<<10 + recordOverhead + 200)}
		for i := range 3 {
			if _, err := submit(s, "carol", fmt.Sprint("c", i), bytes, 4<<10, 10); err != nil {
				t.Fatal(err)
			}
		}
		if _, err := submit(s, "carol", "c3", bytes, 4<<10, 10); runbox.ErrorCode(err) != runbox.EBusy ||
			!strings.Contains(runbox.ErrorMessage(err), "bytes") {
			t.Fatalf("past the bytes: %v", err)
		}
		// A run cancelled while it waits leaves the queue too.
		finishQueued(t, s, "c1", "~carol~c-c1")
		if _, err := submit(s, "carol", "c3", bytes, 4<<10, 10); err != nil {
			t.Fatalf("after a cancel: %v", err)
		}
		if n, _ := s.rdb.HLen(ctx, queuedKey("carol")).Result(); n != 3 {
			t.Errorf("carol's queue holds %d", n)
		}
	})
}

// finishQueued cancels a queued run.
func finishQueued(t *testing.T, s *Store, id, cid string) runbox.Applied {
	t.Helper()
	a, err := s.Finish(context.Background(), id, runbox.Ending{From: []runbox.Status{runbox.StatusQueued},
		Status: runbox.StatusCancelled, Result: &runbox.Result{Cancelled: true}, Conversation: cid})
	if err != nil || !a.Done {
		t.Fatalf("cancel %s: %+v, %v", id, a, err)
	}
	return a
}

// TestFairTurns: a client with a thousand runs waiting has at most
// dispatchAhead given to executors at a time; another client's run is
// given at once, and taken within dispatchAhead claims, however many the
// first has waiting. The first's runs go in the order they came.
func TestFairTurns(t *testing.T) {
	backends(t, func(t *testing.T, s *Store) {
		ctx := context.Background()
		nb := testBatch("batch_f", "alice", runbox.MaxBatchRuns)
		if _, _, err := s.CreateBatch(ctx, nb); err != nil {
			t.Fatal(err)
		}
		// given is asynq's queue: what was given, oldest first.
		var given []string
		for _, r := range nb.Runs[:dispatchAhead] {
			given = append(given, r.Run.ID)
		}
		if got := tasks(t, s, nb.Runs[0].Run.ID, nb.Runs[1].Run.ID, nb.Runs[2].Run.ID); !slices.Equal(got, given) {
			t.Fatalf("given %v; want %v", got, given)
		}
		adm, err := submit(s, "bob", "bob", runbox.ClientBounds{}, 10, 10)
		if err != nil || adm != runbox.AdmitEnqueue {
			t.Fatalf("bob's run: %v, %v; want it given at once", adm, err)
		}
		given = append(given, "bob")
		var taken []string
		for len(taken) < 10 {
			id := given[0]
			given = given[1:]
			c, err := s.ClaimFor(ctx, id, "ex", time.Minute, 0)
			if err != nil || !c.OK {
				t.Fatalf("claim %s: %+v, %v", id, c, err)
			}
			taken = append(taken, id)
			given = append(given, c.Dispatch...)
		}
		if i := slices.Index(taken, "bob"); i < 0 || i > dispatchAhead {
			t.Fatalf("bob's run was taken %dth: %v", i+1, taken)
		}
		var alices []string
		for _, id := range taken {
			if id != "bob" {
				alices = append(alices, id)
			}
		}
		for i, id := range alices {
			if id != nb.Runs[i].Run.ID {
				t.Fatalf("alice's runs taken out of order: %v", alices)
			}
		}
		if n, _ := s.rdb.ZCard(ctx, dispatchedKey("alice")).Result(); n != dispatchAhead {
			t.Errorf("alice has %d given and not taken; want %d", n, dispatchAhead)
		}
	})
}

// TestRunSecondsReserved: a run reserves its timeout of its client's day
// until it ends; one that does not fit is refused quota_exceeded, and an
// end gives back what its run did not use.
func TestRunSecondsReserved(t *testing.T) {
	backends(t, func(t *testing.T, s *Store) {
		ctx := context.Background()
		b := runbox.ClientBounds{RunSecondsPerDay: 20}
		if _, err := submit(s, "dave", "d0", b, 10, 15); err != nil {
			t.Fatal(err)
		}
		if used, reserved, err := s.RunSeconds(ctx, "dave"); err != nil || used != 0 || reserved != 15 {
			t.Fatalf("RunSeconds = %d, %d, %v; want 0 used, 15 reserved", used, reserved, err)
		}
		_, err := submit(s, "dave", "d1", b, 10, 10)
		if runbox.ErrorCode(err) != runbox.EQuotaExceeded || runbox.RetryAfterSeconds(err) == 0 {
			t.Fatalf("10 s more of 20, 15 reserved: %v", err)
		}
		nb := testBatch("batch_s", "dave", 1)
		nb.Bounds = b
		if _, _, err := s.CreateBatch(ctx, nb); runbox.ErrorCode(err) != runbox.EQuotaExceeded {
			t.Fatalf("a batch of 10 s more: %v", err)
		}
		// It ran 4 s of its 15: 16 are left.
		if c, err := s.ClaimFor(ctx, "d0", "ex", time.Minute, 0); err != nil || !c.OK {
			t.Fatal(c, err)
		}
		if _, err := s.Finish(ctx, "d0", runbox.Ending{From: []runbox.Status{runbox.StatusRunning}, Status: runbox.StatusSucceeded,
			Result: &runbox.Result{DurationMS: 3200}, Conversation: "~dave~c-d0"}); err != nil {
			t.Fatal(err)
		}
		if used, reserved, _ := s.RunSeconds(ctx, "dave"); used != 4 || reserved != 0 {
			t.Fatalf("after the end: %d used, %d reserved; want 4, 0", used, reserved)
		}
		if _, err := submit(s, "dave", "d1", b, 10, 10); err != nil {
			t.Fatalf("10 s of the 16 left: %v", err)
		}
		if _, err := submit(s, "dave", "d2", b, 10, 7); runbox.ErrorCode(err) != runbox.EQuotaExceeded {
			t.Fatalf("7 s of the 6 left: %v", err)
		}
	})
}

// TestReconcile: what a crash leaves of a client's counts — a run given
// to asynq whose record is gone, a run counted waiting that is not — is
// mended by the sweep, which then lets the client's waiting heads go.
func TestReconcile(t *testing.T) {
	backends(t, func(t *testing.T, s *Store) {
		ctx := context.Background()
		for i := range 4 {
			if _, err := submit(s, "erin", fmt.Sprint("e", i), runbox.ClientBounds{}, 10, 10); err != nil {
				t.Fatal(err)
			}
		}
		// e0 and e1 were given; their records vanish (as a crash
		// between steps, or an expiry, would leave them).
		s.rdb.Del(ctx, "runbox:run:{e0}", "runbox:run:{e1}")
		if ids, err := s.Reconcile(ctx, false); err != nil || !slices.Equal(ids, []string{"e2", "e3"}) {
			t.Fatalf("Reconcile = %v, %v; want e2 and e3 let go", ids, err)
		}
		if n, _ := s.rdb.HLen(ctx, queuedKey("erin")).Result(); n != 2 {
			t.Errorf("erin's queue holds %d; want e2 and e3", n)
		}
		// A run counted waiting whose record is gone is forgotten by a
		// full reconcile.
		s.rdb.HSet(ctx, queuedKey("erin"), "ghost", 100)
		if _, err := s.Reconcile(ctx, true); err != nil {
			t.Fatal(err)
		}
		if ok, _ := s.rdb.HExists(ctx, queuedKey("erin"), "ghost").Result(); ok {
			t.Error("a ghost stays counted after a full reconcile")
		}
		// A head queued a while and given is the sweep's to enqueue
		// again; one waiting its turn is not; nor one given just now.
		if _, err := submit(s, "erin", "e4", runbox.ClientBounds{}, 10, 10); err != nil {
			t.Fatal(err)
		}
		// (e0 and e1, whose records are gone, are ended: the sweep moves
		// their conversations on.)
		stale := func(cutoff time.Time) string {
			heads, err := s.StaleHeads(ctx, cutoff)
			if err != nil {
				t.Fatal(err)
			}
			var out []string
			for _, h := range heads {
				out = append(out, fmt.Sprintf("%s:%v", h.Run, h.Ended))
			}
			slices.Sort(out)
			return fmt.Sprint(out)
		}
		if got := stale(time.Now().Add(time.Second)); got != "[e0:true e1:true e2:false e3:false]" {
			t.Errorf("StaleHeads = %s; want e2 and e3 to enqueue, e0 and e1 ended", got)
		}
		if got := stale(time.Now().Add(-time.Minute)); got != "[e0:true e1:true]" {
			t.Errorf("StaleHeads of a minute ago = %s; want only the ended", got)
		}
		s.rdb.HSet(ctx, "runbox:run:{e2}", "status", "succeeded")
		if got := stale(time.Now().Add(-time.Minute)); got != "[e0:true e1:true e2:true]" {
			t.Errorf("StaleHeads with e2 ended = %s", got)
		}
	})
}

// TestQueuedBytes: what the bounds count of a waiting run is what it costs
// Redis, within a small multiple — measured on redis-server, by its own
// account, for a thousand runs of a 20 KiB (and of a 10-byte) program in
// new conversations, one at a time and as a batch.
func TestQueuedBytes(t *testing.T) {
	for _, size := range []int{20 << 10, 10} {
		t.Run(strconv.Itoa(size), func(t *testing.T) { queuedBytes(t, size) })
	}
}

func queuedBytes(t *testing.T, size int) {
	s := New(NewConn(testenv.Client(t, testenv.Redis(t))))
	ctx := context.Background()
	used := func() int64 {
		info, err := s.rdb.Info(ctx, "memory").Result()
		if err != nil {
			t.Fatal(err)
		}
		m := regexp.MustCompile(`used_memory:(\d+)`).FindStringSubmatch(info)
		n, _ := strconv.ParseInt(m[1], 10, 64)
		return n
	}
	counted := func(client string) int64 {
		n, _ := s.rdb.Get(ctx, queuedKey(client)+":total").Int64()
		return n
	}
	base := used()
	for i := range 1000 {
		if _, err := submit(s, "frank", fmt.Sprint("f", i), runbox.ClientBounds{}, size, 10); err != nil {
			t.Fatal(err)
		}
	}
	single := used() - base
	nb := testBatch("batch_m", "grace", runbox.MaxBatchRuns)
	for i := range nb.Runs {
		nb.Runs[i].Spec.Code = strings.Repeat("x", size)
	}
	base = used()
	if _, _, err := s.CreateBatch(ctx, nb); err != nil {
		t.Fatal(err)
	}
	batch := used() - base
	for _, m := range []struct {
		name          string
		used, counted int64
	}{{"single runs", single, counted("frank")}, {"a batch", batch, counted("grace")}} {
		ratio := float64(m.used) / float64(m.counted)
		t.Logf("%s: Redis used %d bytes for %d counted (%.2f×)", m.name, m.used, m.counted, ratio)
		if ratio > 1.5 {
			t.Errorf("%s cost Redis %.2f× what their client's bound counts", m.name, ratio)
		}
	}
}
