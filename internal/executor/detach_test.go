package executor

import (
	"context"
	"crypto/rand"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/jonboulle/clockwork"

	"github.com/runbox-dev/runbox"
	"github.com/runbox-dev/runbox/internal/files"
	"github.com/runbox-dev/runbox/internal/lifecycle"
	"github.com/runbox-dev/runbox/internal/link"
	"github.com/runbox-dev/runbox/internal/queue"
	"github.com/runbox-dev/runbox/internal/s3store"
	"github.com/runbox-dev/runbox/internal/sandbox"
	"github.com/runbox-dev/runbox/internal/sandbox/docker"
	"github.com/runbox-dev/runbox/internal/sandbox/docker/dockertest"
	"github.com/runbox-dev/runbox/internal/store"
	"github.com/runbox-dev/runbox/internal/testenv"
	"github.com/runbox-dev/runbox/internal/watchdog"
	"github.com/runbox-dev/runbox/internal/workcopy"
)

// rig is one executor on a real redis-server and the real Docker Engine,
// with one slot: runs are submitted to the store as the api would.
type rig struct {
	t       *testing.T
	e       *Executor
	store   *store.Store
	sched   *queue.Scheduler
	conn    *store.Conn
	folders *files.Folders
	n       int
	stop    sync.Once
}

func newRig(t *testing.T, cfg Config) *rig {
	t.Helper()
	rdb := testenv.Client(t, testenv.Redis(t))
	conn := store.NewConn(rdb)
	st := store.New(conn)
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	sched := queue.NewScheduler(st, queue.NewClient(conn), log)
	root := t.TempDir()
	folders, err := files.NewFolders(root, files.Options{UID: sandbox.UID, GID: sandbox.GID, Quota: 1 << 30,
		Files: 100000, Mode: files.QuotaWalk})
	if err != nil {
		t.Fatal(err)
	}
	cfg.ID = "test-" + strings.ToLower(rand.Text()[:8])
	cfg.Concurrency = max(cfg.Concurrency, 1)
	cfg.MaxOutput = 1 << 16
	cfg.ShutdownGrace = cmpOr(cfg.ShutdownGrace, 10*time.Second)
	cfg.PollInterval = 50 * time.Millisecond
	cfg.Schedule = lifecycle.Periodic(clockwork.NewRealClock())
	m := sandbox.NewManager(docker.New(dockertest.Client(t), docker.Options{}), sandbox.Options{ExecutorID: cfg.ID, Limits: sandbox.Limits{
		Memory: 256 << 20, NanoCPUs: 1e9, Pids: 128}, MaxWarm: sandbox.WarmLimits{Default: 8}, ImageTag: os.Getenv("RUNNER_TAG")})
	e := New(cfg, queue.NewWorker(conn, cfg.ID, log.With("executor", cfg.ID)), st, sched, m, folders, files.NewSigner([]byte("0123456789abcdef0123456789abcdef"), "http://test", time.Hour), log)
	if err := e.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	r := &rig{t: t, e: e, store: st, sched: sched, conn: conn, folders: folders}
	t.Cleanup(func() { r.shutdown() })
	return r
}

func cmpOr(d, def time.Duration) time.Duration {
	if d != 0 {
		return d
	}
	return def
}

func (r *rig) shutdown() {
	r.stop.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		r.e.Shutdown(ctx)
	})
}

// submit records and enqueues a run as runs.Service.Submit does.
func (r *rig) submit(spec runbox.Spec) string {
	r.t.Helper()
	r.n++
	id := fmt.Sprintf("run_%024d", r.n)
	spec.Language = cmpStr(spec.Language, "bash")
	if spec.TimeoutSeconds == 0 {
		spec.TimeoutSeconds = 60
	}
	ctx := context.Background()
	adm, _, err := r.store.CreateRun(ctx, runbox.NewRun{
		Run: runbox.Run{ID: id, ConversationID: spec.ConversationID, Language: spec.Language,
			Status: runbox.StatusQueued, CreatedAt: time.Now()},
		Spec: spec, MaxWaiting: 16, Parallel: spec.Parallel,
	})
	if err != nil {
		r.t.Fatal(err)
	}
	if adm == runbox.AdmitEnqueue {
		if err := r.sched.Enqueue(ctx, id); err != nil {
			r.t.Fatal(err)
		}
	}
	return id
}

func cmpStr(s, def string) string {
	if s != "" {
		return s
	}
	return def
}

// wait follows a run to its end and returns its record.
func (r *rig) wait(id string) runbox.Run {
	r.t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for time.Now().Before(deadline) {
		run, err := r.store.Run(context.Background(), id)
		if err != nil {
			r.t.Fatal(err)
		}
		if run.Status.Final() {
			return run
		}
		time.Sleep(20 * time.Millisecond)
	}
	r.t.Fatalf("run %s did not end", id)
	return runbox.Run{}
}

// waitEvent waits for an event of a run.
func (r *rig) waitEvent(id, typ string) {
	r.t.Helper()
	deadline := time.Now().Add(time.Minute)
	for time.Now().Before(deadline) {
		evs, err := r.store.Events(context.Background(), id, 0)
		if err != nil {
			r.t.Fatal(err)
		}
		for _, ev := range evs {
			if ev.Type == typ {
				return
			}
		}
		time.Sleep(20 * time.Millisecond)
	}
	r.t.Fatalf("run %s never had a %s event", id, typ)
}

// touch makes a file in a conversation's folder, as a client's upload
// would.
func (r *rig) touch(cid, name string) {
	r.t.Helper()
	if _, err := r.folders.Write(cid, name, strings.NewReader("x"), 10, true); err != nil {
		r.t.Fatal(err)
	}
}

// waitFor is a shell loop that waits up to 60 s for a file in /data and
// fails the program if it never comes.
func waitFor(name string) string {
	return fmt.Sprintf("for i in $(seq 600); do [ -e %s ] && break; sleep 0.1; done; [ -e %s ] || { echo timeout >&2; exit 9; }", name, name)
}

// TestParallelRunsOfOneConversation: five parallel runs of one
// conversation on an executor with one slot all run at once — each waits
// for the other four to have started — in sandboxes of their own
// mounting the same folder, and all finish.
func TestParallelRunsOfOneConversation(t *testing.T) {
	r := newRig(t, Config{Concurrency: 1})
	var ids []string
	for i := range 5 {
		code := fmt.Sprintf("touch started-%d; ", i)
		for j := range 5 {
			code += waitFor(fmt.Sprintf("started-%d", j)) + "; "
		}
		code += "cat /etc/hostname"
		ids = append(ids, r.submit(runbox.Spec{ConversationID: "conv", Code: code, Parallel: true}))
	}
	hosts := map[string]bool{}
	for _, id := range ids {
		run := r.wait(id)
		if run.Status != runbox.StatusSucceeded {
			t.Fatalf("run %s: %s %+v", id, run.Status, run.Result)
		}
		hosts[run.Result.Stdout] = true
		evs, _ := r.store.Events(context.Background(), id, 0)
		if !hasEvent(evs, runbox.EventDetached) {
			t.Errorf("run %s did not detach: %v", id, evs)
		}
	}
	if len(hosts) != 5 {
		t.Errorf("five runs ran in %d sandboxes", len(hosts))
	}
	if busy, _ := r.store.Busy(context.Background(), "conv"); busy {
		t.Error("the conversation is busy after its runs ended")
	}
}

// TestDetachedRunHoldsNoSlot: a detached run gives back the executor's
// only slot once its program has started: the runs after it — of its
// conversation and of another — run while it still runs. Then it is
// ended by what ends any run: its end, a cancel, its timeout, and the
// executor's shutdown.
func TestDetachedRunHoldsNoSlot(t *testing.T) {
	r := newRig(t, Config{Concurrency: 1, ShutdownGrace: time.Second})
	ctx := context.Background()
	server := r.submit(runbox.Spec{ConversationID: "conv", Code: "echo up; " + waitFor("stop"), Detach: true})
	r.waitEvent(server, runbox.EventDetached)
	for _, cid := range []string{"conv", "other"} {
		if run := r.wait(r.submit(runbox.Spec{ConversationID: cid, Code: "echo beside"})); run.Status != runbox.StatusSucceeded {
			t.Fatalf("a run beside the detached one: %s %+v", run.Status, run.Result)
		}
	}
	if run, _ := r.store.Run(ctx, server); run.Status != runbox.StatusRunning {
		t.Fatalf("the detached run is %s", run.Status)
	}
	r.touch("conv", "stop")
	if run := r.wait(server); run.Status != runbox.StatusSucceeded || run.Result.Stdout != "up\n" {
		t.Errorf("the detached run ended %s %+v", run.Status, run.Result)
	}

	t.Run("cancel", func(t *testing.T) {
		id := r.submit(runbox.Spec{ConversationID: "conv", Code: "sleep 60", Detach: true})
		r.waitEvent(id, runbox.EventDetached)
		if err := r.store.RequestCancel(ctx, id, false); err != nil {
			t.Fatal(err)
		}
		if run := r.wait(id); run.Status != runbox.StatusCancelled {
			t.Errorf("cancelled detached run is %s", run.Status)
		}
	})
	t.Run("timeout", func(t *testing.T) {
		id := r.submit(runbox.Spec{ConversationID: "conv", Code: "sleep 60", Detach: true, TimeoutSeconds: 2})
		r.waitEvent(id, runbox.EventDetached)
		if run := r.wait(id); run.Status != runbox.StatusTimedOut {
			t.Errorf("run is %s", run.Status)
		}
	})
	t.Run("shutdown", func(t *testing.T) {
		id := r.submit(runbox.Spec{ConversationID: "conv", Code: "sleep 60", Detach: true})
		r.waitEvent(id, runbox.EventDetached)
		r.shutdown()
		run := r.wait(id)
		if run.Status != runbox.StatusError || !strings.Contains(run.Result.Error, "shut down") {
			t.Errorf("after shutdown the detached run is %s %+v", run.Status, run.Result)
		}
	})
}

func hasEvent(evs []runbox.Event, typ string) bool {
	for _, ev := range evs {
		if ev.Type == typ {
			return true
		}
	}
	return false
}

// TestWatchdogEndsDetachedRunOfDeadExecutor: a detached run's lease is
// renewed like any run's; when its executor stops renewing it (it died),
// the watchdog ends the run as lost.
func TestWatchdogEndsDetachedRunOfDeadExecutor(t *testing.T) {
	r := newRig(t, Config{Concurrency: 1, Lease: time.Second, HeartbeatInterval: 200 * time.Millisecond,
		ShutdownGrace: time.Second})
	id := r.submit(runbox.Spec{ConversationID: "conv", Code: "sleep 60", Detach: true})
	r.waitEvent(id, runbox.EventDetached)
	// Still renewed after a few leases.
	time.Sleep(3 * time.Second)
	if run, _ := r.store.Run(context.Background(), id); run.Status != runbox.StatusRunning {
		t.Fatalf("a detached run of a live executor is %s", run.Status)
	}
	r.e.background[0].Stop() // the heartbeat: the executor is as good as dead
	log := slog.New(slog.DiscardHandler)
	wd := watchdog.New(r.store, r.sched, lifecycle.Periodic(clockwork.NewRealClock()), log)
	if err := wd.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer wd.Stop()
	run := r.wait(id)
	if run.Status != runbox.StatusError || run.Result.Error != watchdog.LostMessage {
		t.Errorf("the lost run ended %s %+v", run.Status, run.Result)
	}
}

// TestHeartbeatSparesUnclaimedRun: a run is active from before its claim
// makes its lease; a heartbeat in between must not declare it lost (CI
// saw a run end "declared lost" as its sandbox started).
func TestHeartbeatSparesUnclaimedRun(t *testing.T) {
	r := newRig(t, Config{Concurrency: 1})
	ctx, cancel := context.WithCancelCause(context.Background())
	defer cancel(nil)
	r.e.mu.Lock()
	r.e.active["run_unclaimed"] = &activeRun{cancel: cancel, ended: make(chan struct{}), detached: make(chan struct{})}
	r.e.mu.Unlock()
	defer func() {
		r.e.mu.Lock()
		delete(r.e.active, "run_unclaimed")
		r.e.mu.Unlock()
	}()
	r.e.renew(context.Background())
	if err := context.Cause(ctx); err != nil {
		t.Fatalf("a heartbeat ended a run before its claim: %v", err)
	}
}

// TestReleaseSparesRestartedPeer: a peer found dead that beat since —
// it restarted under the same id while its old sandboxes were being
// removed — keeps its registration, its runs' leases and its slots; one
// that did not beat loses them.
func TestReleaseSparesRestartedPeer(t *testing.T) {
	r := newRig(t, Config{Concurrency: 1})
	ctx := context.Background()
	for _, peer := range []string{"peer-back", "peer-dead"} {
		if err := r.store.Heartbeat(ctx, runbox.ExecutorInfo{ID: peer}, time.Minute); err != nil {
			t.Fatal(err)
		}
	}
	seen, err := r.store.Beats(ctx, "peer-back", "peer-dead")
	if err != nil {
		t.Fatal(err)
	}
	time.Sleep(5 * time.Millisecond)
	// peer-back restarts: it registers, claims a run and makes a slot.
	if err := r.store.Heartbeat(ctx, runbox.ExecutorInfo{ID: "peer-back"}, time.Minute); err != nil {
		t.Fatal(err)
	}
	ids := map[string]string{}
	for _, peer := range []string{"peer-back", "peer-dead"} {
		// Recorded, never enqueued: the peer claims it at once.
		ids[peer] = "run_" + peer
		cid := "conv-" + peer
		_, _, err := r.store.CreateRun(ctx, runbox.NewRun{
			Run:  runbox.Run{ID: ids[peer], ConversationID: cid, Language: "bash", Status: runbox.StatusQueued, CreatedAt: time.Now()},
			Spec: runbox.Spec{ConversationID: cid, Language: "bash", Code: "true", TimeoutSeconds: 60}, MaxWaiting: 16,
		})
		if err != nil {
			t.Fatal(err)
		}
		if c, err := r.store.ClaimFor(ctx, ids[peer], peer, time.Hour, 0); err != nil || !c.OK {
			t.Fatalf("claim %s as %s: %+v, %v", ids[peer], peer, c, err)
		}
		if _, err := r.folders.NewSlot(SlotPrefix(peer) + "a"); err != nil {
			t.Fatal(err)
		}
	}
	for _, peer := range []string{"peer-back", "peer-dead"} {
		r.e.reaper.release(ctx, peer, seen[peer])
	}
	beats, err := r.store.Beats(ctx, "peer-back", "peer-dead")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		peer string
		kept bool
	}{{"peer-back", true}, {"peer-dead", false}} {
		_, statErr := os.Stat(filepath.Join(r.folders.Root(), ".pool", SlotPrefix(tc.peer)+"a"))
		run, err := r.store.Run(ctx, ids[tc.peer])
		if err != nil {
			t.Fatal(err)
		}
		got := map[string]bool{
			"registered": beats[tc.peer] != 0,
			"its run":    run.Status == runbox.StatusRunning, // the dead one's is ended as lost at once
			"slot":       statErr == nil,
		}
		for what, kept := range got {
			if kept != tc.kept {
				t.Errorf("%s: %s kept = %v, want %v", tc.peer, what, kept, tc.kept)
			}
		}
	}
}

// TestShutdownLeavesWaitingRunQueued: a run that asynq handed to a handler
// still waiting for a slot when the executor began to stop is not claimed
// when the slot comes free: it stays queued, for another executor, and
// the conversation the stopping executor owned is owned by none.
func TestShutdownLeavesWaitingRunQueued(t *testing.T) {
	r := newRig(t, Config{Concurrency: 1, ShutdownGrace: 5 * time.Second})
	ctx := context.Background()
	r.e.slots <- struct{}{} // a run holds the only slot
	cid := "conv-wait"
	if err := r.store.SetOwner(ctx, cid, r.e.cfg.ID, time.Minute); err != nil {
		t.Fatal(err)
	}
	id := r.submit(runbox.Spec{ConversationID: cid, Code: "echo ran"})
	in := asynq.NewInspectorFromRedisClient(r.conn.Redis())
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		info, err := in.GetTaskInfo(queue.ExecutorQueue(r.e.cfg.ID), id)
		if err == nil && info.State == asynq.TaskStateActive {
			break // its handler waits for the slot
		}
		if time.Now().After(deadline) {
			t.Fatalf("no handler took the run: %+v, %v", info, err)
		}
	}
	stopped := make(chan struct{})
	go func() { r.shutdown(); close(stopped) }()
	for {
		r.e.mu.Lock()
		stopping := r.e.stopping
		r.e.mu.Unlock()
		if stopping {
			break
		}
		time.Sleep(time.Millisecond)
	}
	// Its conversations go to any executor while it waits for its runs.
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		owner, err := r.store.Owner(ctx, cid)
		if err == nil && owner == "" {
			break
		}
		if time.Now().After(deadline) {
			t.Errorf("a stopping executor still owns its conversation: %q (%v)", owner, err)
			break
		}
	}
	<-r.e.slots // the holder ends
	<-stopped
	if run, err := r.store.Run(ctx, id); err != nil || run.Status != runbox.StatusQueued {
		t.Errorf("the waiting run is %s (%v); want it left queued", run.Status, err)
	}
}

// TestWriteFilesOneAtATime: files written into a running project at once
// by several calls, with a remote file store, go through the working
// copy one call at a time (its manifest has one user: the race detector
// caught concurrent writes to it), and all reach the store.
func TestWriteFilesOneAtATime(t *testing.T) {
	ctx := context.Background()
	s3, err := s3store.Open(ctx, testenv.S3(t, "runbox-files"), 1<<20)
	if err != nil {
		t.Fatal(err)
	}
	r := newRig(t, Config{Concurrency: 1})
	r.e.cfg.Copies = workcopy.New(s3, r.folders, r.store, os.Getuid(), os.Getgid(), slog.New(slog.DiscardHandler))
	if _, err := r.folders.Ensure("proj"); err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Go(func() {
			f := link.File{Path: fmt.Sprintf("src/f%d.txt", i), Data: []byte("x")}
			if err := r.e.WriteFiles(ctx, "proj", []link.File{f}); err != nil {
				t.Errorf("write %s: %v", f.Path, err)
			}
		})
	}
	wg.Wait()
	stored, err := s3.List(ctx, "proj")
	if err != nil {
		t.Fatal(err)
	}
	if len(stored) != 8 {
		t.Errorf("the store has %d files, want 8: %+v", len(stored), stored)
	}
}
