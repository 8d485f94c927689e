package runs

import (
	"context"
	"time"

	"github.com/runbox-dev/runbox"
)

// Store is what the Service reads and writes of the shared state (a
// *store.Store): runs, batches, the clients' limits and the live
// executors.
type Store interface {
	// Runs: records, event logs, cancellations and input.
	CreateRun(ctx context.Context, nr runbox.NewRun) (runbox.Admission, string, error)
	Queued(ctx context.Context, client string) (runs int, bytes int64, err error)
	Run(ctx context.Context, id string) (runbox.Run, error)
	RunsWhere(ctx context.Context, client, cid string, n int, keep func(runbox.Run) bool) ([]runbox.Run, error)
	Events(ctx context.Context, id string, after int64) ([]runbox.Event, error)
	Finish(ctx context.Context, id string, e runbox.Ending) (runbox.Applied, error)
	RequestCancel(ctx context.Context, id string, graceful bool) error
	SendStdin(ctx context.Context, id string, data []byte, eof bool) error
	// Retention is how long runs are kept.
	Retention() time.Duration

	// Batches.
	CreateBatch(ctx context.Context, nb runbox.NewBatch) (string, bool, error)
	Batch(ctx context.Context, id string) (runbox.BatchRecord, error)
	BatchRuns(ctx context.Context, id string, offset, limit int) ([]string, error)
	RunsOf(ctx context.Context, ids []string) ([]runbox.Run, error)
	CancellingBatch(ctx context.Context, id string) error

	// Limits: what a client may do, and does.
	AllowCall(ctx context.Context, client string, perMinute int) (time.Duration, error)
	AllowConversation(ctx context.Context, client, key string, perHour int, ttl time.Duration) (time.Duration, error)
	AllowConversations(ctx context.Context, client string, keys []string, perHour int) (time.Duration, error)
	ActiveRuns(ctx context.Context, client string) (int, error)
	RunSeconds(ctx context.Context, client string) (used, reserved int64, err error)

	// Executors: what the live ones offer, which holds a conversation.
	Owner(ctx context.Context, cid string) (string, error)
	LiveExecutors(ctx context.Context) ([]runbox.ExecutorInfo, error)
	Runners(ctx context.Context) ([]runbox.Runner, error)
	HeldConversations(ctx context.Context) (int, error)
	Unowned(ctx context.Context, keys []string) (int, error)
}
