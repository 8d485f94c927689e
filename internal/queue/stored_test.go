package queue

import (
	"bytes"
	"context"
	"testing"
	"time"

	"github.com/hibiken/asynq"

	"github.com/runbox-dev/runbox"
	"github.com/runbox-dev/runbox/internal/store"
	"github.com/runbox-dev/runbox/internal/testenv"
)

// TestStoredTaskIsAsynqs checks the layout a batch's script writes tasks
// in against asynq itself: the message is byte for byte what asynq's
// client writes for NewTask, and a task the store wrote is one asynq's
// inspector reads and its worker runs.
func TestStoredTaskIsAsynqs(t *testing.T) {
	_, url := testenv.Miniredis(t)
	rdb := testenv.Client(t, url)
	conn := store.NewConn(rdb)
	ctx := context.Background()

	// asynq's own encoding of a run's task.
	c := NewClient(conn)
	sched := NewScheduler(nil, c, nil)
	if _, err := c.Enqueue(ctx, "run_asynqs", 90*time.Second, Name); err != nil {
		t.Fatal(err)
	}
	want, err := rdb.HGet(ctx, sched.SharedQueue().TaskKeyPrefix+"run_asynqs", "msg").Bytes()
	if err != nil {
		t.Fatal(err)
	}
	got, err := sched.StoredTask("run_asynqs", 90*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, want) {
		t.Fatalf("StoredTask = %x\nasynq writes %x", got, want)
	}

	// A task the store wrote, read and run by asynq.
	st := store.New(conn)
	task, _ := sched.StoredTask("run_stored", 30*time.Second)
	_, _, err = st.CreateBatch(ctx, runbox.NewBatch{ID: "batch_stored", Client: "c", CreatedAt: time.Now(), Queue: sched.SharedQueue(),
		Runs: []runbox.BatchRun{{Run: runbox.Run{ID: "run_stored", ConversationID: "~c~conv", Language: "bash"},
			Spec: runbox.Spec{Language: "bash", Code: "true", ConversationID: "~c~conv"}, Task: task}}})
	if err != nil {
		t.Fatal(err)
	}
	info, err := asynq.NewInspectorFromRedisClient(rdb).GetTaskInfo(Name, "run_stored")
	if err != nil {
		t.Fatal(err)
	}
	if info.Type != TypeRun || info.MaxRetry != 0 || info.Timeout != 30*time.Second+timeoutMargin ||
		info.Retention != Retention || info.State != asynq.TaskStatePending || info.Queue != Name {
		t.Fatalf("asynq reads %+v", info)
	}
	handled := make(chan string, 1)
	srv := asynq.NewServerFromRedisClient(rdb, asynq.Config{Queues: map[string]int{Name: 1},
		TaskCheckInterval: 10 * time.Millisecond, LogLevel: asynq.FatalLevel})
	mux := asynq.NewServeMux()
	mux.HandleFunc(TypeRun, func(_ context.Context, t *asynq.Task) error {
		p, err := Decode(t)
		if err == nil {
			handled <- p.RunID
		}
		return err
	})
	if err := srv.Start(mux); err != nil {
		t.Fatal(err)
	}
	defer srv.Shutdown()
	for {
		select {
		case id := <-handled:
			if id == "run_asynqs" {
				continue // the first task, enqueued by asynq's client
			}
			if id != "run_stored" {
				t.Fatalf("handled %q", id)
			}
			return
		case <-time.After(30 * time.Second):
			t.Fatal("asynq's worker did not run the task the store wrote")
		}
	}
}
