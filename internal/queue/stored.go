package queue

import (
	"encoding/json"
	"fmt"
	"time"

	"google.golang.org/protobuf/encoding/protowire"

	"github.com/runbox-dev/runbox"
)

// A batch of runs (store.Batches.CreateBatch) is enqueued in one script with its
// records, not through asynq's client one call per run: the script writes
// each task where asynq keeps it, as asynq's own enqueue script does. This
// file is the only place that knows that layout, asynq v0.26's: a hash
// asynq:{<queue>}:t:<id> holding the task message (protobuf, below),
// its state and when it became pending, its id pushed on
// asynq:{<queue>}:pending, and the queue named in asynq:queues.
// TestStoredTaskIsAsynqs checks it against asynq's inspector and worker.

// SharedQueue is where tasks of the shared queue (Name) are written: a
// batch's, in one script (store.Batches.CreateBatch).
func (*Scheduler) SharedQueue() runbox.TaskQueue {
	const prefix = "asynq:{" + Name + "}:"
	return runbox.TaskQueue{
		Name:          Name,
		TaskKeyPrefix: prefix + "t:",
		PendingKey:    prefix + "pending",
		QueuesKey:     "asynq:queues",
	}
}

// Fields of asynq's TaskMessage (its internal/proto/asynq.proto).
const (
	fieldType      = 1
	fieldPayload   = 2
	fieldID        = 3
	fieldQueue     = 4
	fieldTimeout   = 8
	fieldRetention = 12
)

// StoredTask returns a run's task (NewTask's) in the shared queue as asynq
// stores it, for a batch's records: the encoded task message, fields in
// number order as protobuf's own encoder writes them. Zero fields are left
// out, as in proto3: no retry (MaxRetry(0)), no deadline.
func (*Scheduler) StoredTask(runID string, timeout time.Duration) ([]byte, error) {
	payload, err := json.Marshal(Payload{RunID: runID})
	if err != nil {
		return nil, fmt.Errorf("encode task: %w", err)
	}
	var b []byte
	b = protowire.AppendTag(b, fieldType, protowire.BytesType)
	b = protowire.AppendString(b, TypeRun)
	b = protowire.AppendTag(b, fieldPayload, protowire.BytesType)
	b = protowire.AppendBytes(b, payload)
	b = protowire.AppendTag(b, fieldID, protowire.BytesType)
	b = protowire.AppendString(b, runID)
	b = protowire.AppendTag(b, fieldQueue, protowire.BytesType)
	b = protowire.AppendString(b, Name)
	b = protowire.AppendTag(b, fieldTimeout, protowire.VarintType)
	b = protowire.AppendVarint(b, uint64((timeout.Truncate(time.Second)+timeoutMargin)/time.Second))
	b = protowire.AppendTag(b, fieldRetention, protowire.VarintType)
	b = protowire.AppendVarint(b, uint64(Retention/time.Second))
	return b, nil
}
