package queue

import (
	"context"
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
	st := store.New(testenv.Client(t, url))
	opt, _ := RedisOpt(url)
	q := NewClient(opt)
	defer q.Close()
	sched := NewScheduler(st, q, slog.New(slog.DiscardHandler))
	ctx := context.Background()
	old := time.Now().Add(-time.Minute)
	create := func(id, cid string) {
		_, _, err := st.CreateRun(ctx, store.NewRun{
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
	insp := asynq.NewInspector(opt)
	defer insp.Close()
	for _, id := range []string{"a2", "b1"} {
		if _, err := insp.GetTaskInfo(Name, id); err != nil {
			t.Errorf("run %s was not enqueued: %v", id, err)
		}
	}
	if _, err := insp.GetTaskInfo(Name, "a1"); err == nil {
		t.Error("the ended head was enqueued")
	}
	// A second sweep changes nothing.
	sched.Sweep(ctx)
	heads, _ := st.Heads(ctx)
	if len(heads) != 2 {
		t.Errorf("heads %v", heads)
	}
}
