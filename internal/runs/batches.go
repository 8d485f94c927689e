package runs

import (
	"context"
	"errors"
	"regexp"
	"slices"
	"strconv"
	"time"

	"github.com/runbox-dev/runbox"
	"github.com/runbox-dev/runbox/internal/auth"
)

// A batch is many runs submitted at once, for back ends and agents that
// fan out (a parameter sweep): checked as a whole before anything is
// recorded — one bad run refuses the batch, naming its index — then
// recorded and enqueued by one script (store.Batches.CreateBatch). Each run is
// held to its client's tier as a run submitted alone would be, but a
// batch is not refused for the client's concurrent runs: what does not
// fit waits in the queue, in order.

// BatchRequest is the body of POST /v1/batches and start_batch's
// arguments.
type BatchRequest struct {
	Runs           []StartRequest `json:"runs" jsonschema:"the runs, each as start_run takes it (at most 1000); each runs in a new conversation unless it names one, and they start as this client's concurrent runs allow"`
	CallbackURL    string         `json:"callback_url,omitempty" jsonschema:"an https URL runbox POSTs the batch's counts to when its last run ends, signed per Standard Webhooks"`
	IdempotencyKey string         `json:"idempotency_key,omitempty" jsonschema:"the same key within 24 hours returns the same batch instead of submitting it again"`
}

// BatchCreated is what a new batch is: its id and its runs', in the order
// they were given.
type BatchCreated struct {
	BatchID string   `json:"batch_id"`
	RunIDs  []string `json:"run_ids"`
}

// BatchPage is a batch's counts and a page of its runs, in the order they
// were given, with their results once done; NextCursor, when there are
// more, is the cursor of the next page.
type BatchPage struct {
	runbox.Batch
	Runs       []runbox.Run `json:"runs"`
	NextCursor string       `json:"next_cursor,omitempty"`
}

// Pages of a batch's runs.
const (
	DefaultBatchPage = 100
	MaxBatchPage     = 200
)

// minWindow is the fewest runs of a client without concurrent_runs that
// a batch's may join in the queue.
const minWindow = 64

var batchIDPattern = regexp.MustCompile(`^batch_[0-9a-f]{24}$`)

// ErrBatchNotFound reports a batch that is not the caller's, or none.
var ErrBatchNotFound = runbox.ErrBatchNotFound

// SubmitBatch checks a batch as a whole and records and enqueues it. An
// idempotency key the client used before returns that batch.
func (s *Service) SubmitBatch(ctx context.Context, req BatchRequest) (BatchCreated, error) {
	c := client(ctx)
	switch {
	case len(req.Runs) == 0:
		return BatchCreated{}, runbox.Errorf(runbox.EInvalid, "runs is empty")
	case len(req.Runs) > runbox.MaxBatchRuns:
		return BatchCreated{}, runbox.Errorf(runbox.EInvalid, "runs has %d entries; a batch takes at most %d", len(req.Runs), runbox.MaxBatchRuns)
	case len(req.IdempotencyKey) > 200:
		return BatchCreated{}, runbox.Errorf(runbox.EInvalid, "idempotency_key is longer than 200 bytes")
	}
	infos, err := s.store.LiveExecutors(ctx)
	if err != nil {
		return BatchCreated{}, err
	}
	var names []string
	for _, info := range infos {
		for _, r := range info.Runners {
			if !slices.Contains(names, r.Language) {
				names = append(names, r.Language)
			}
		}
	}
	if len(names) == 0 {
		return BatchCreated{}, runbox.Errorf(runbox.EUnavailable, "no executor is running; try again shortly")
	}
	slices.Sort(names)
	now := time.Now().UTC()
	nb := runbox.NewBatch{ID: "batch_" + randomHex(12), Client: c, CreatedAt: now, Queue: s.sched.SharedQueue(),
		IdempotencyKey: req.IdempotencyKey, Window: batchWindow(ctx, infos)}
	keys := make([]string, 0, len(req.Runs))
	for i, r := range req.Runs {
		br, err := s.batchRun(ctx, r, names, now)
		if err != nil {
			return BatchCreated{}, atIndex(i, err)
		}
		nb.Runs = append(nb.Runs, br)
		keys = append(keys, br.Run.ConversationID)
	}
	hooks, err := s.batchCallbacks(ctx, &nb, req.CallbackURL)
	if err != nil {
		return BatchCreated{}, err
	}
	if err := s.admitBatch(ctx, keys); err != nil {
		s.Metrics.Limited(c, runbox.ErrorCode(err))
		return BatchCreated{}, err
	}
	if err := s.admitWebhooks(ctx, hooks); err != nil {
		return BatchCreated{}, err
	}
	id, created, err := s.store.CreateBatch(ctx, nb)
	if err != nil {
		return BatchCreated{}, err
	}
	if !created {
		// The key was used before: that batch, if it is still the
		// caller's and known.
		rec, err := s.batch(ctx, id)
		if err != nil {
			return BatchCreated{}, err
		}
		ids, err := s.store.BatchRuns(ctx, rec.ID, 0, 0)
		return BatchCreated{BatchID: rec.ID, RunIDs: ids}, err
	}
	out := BatchCreated{BatchID: id, RunIDs: make([]string, len(nb.Runs))}
	for i, r := range nb.Runs {
		out.RunIDs[i] = r.Run.ID
		s.Metrics.Run(c)
	}
	return out, nil
}

// batchRun checks a run of a batch as Submit checks a run, with what the
// batch has read once: the languages the executors offer. Its callback is
// checked with the batch's others (batchCallbacks).
func (s *Service) batchRun(ctx context.Context, r StartRequest, names []string, now time.Time) (runbox.BatchRun, error) {
	if r.IdempotencyKey != "" {
		return runbox.BatchRun{}, runbox.Errorf(runbox.EInvalid, "idempotency_key: a batch takes one of its own, not one per run")
	}
	spec := r.Spec()
	var err error
	if spec.Background {
		err = s.backgroundLimit(ctx, &spec)
	} else {
		err = tierTimeout(ctx, &spec)
	}
	if err != nil {
		return runbox.BatchRun{}, err
	}
	if spec, err = s.normalize(spec); err != nil {
		return runbox.BatchRun{}, err
	}
	if err := s.AdmitEgress(ctx, &spec); err != nil {
		return runbox.BatchRun{}, err
	}
	if err := s.AdmitSecrets(ctx, &spec); err != nil {
		return runbox.BatchRun{}, err
	}
	if spec.ConversationID, err = ConversationKey(ctx, spec.ConversationID); err != nil {
		return runbox.BatchRun{}, err
	}
	if spec.Language, err = languageIn(names, spec.Language); err != nil {
		return runbox.BatchRun{}, err
	}
	id := "run_" + randomHex(12)
	task, err := s.sched.StoredTask(id, spec.Timeout())
	if err != nil {
		return runbox.BatchRun{}, err
	}
	return runbox.BatchRun{
		Run: runbox.Run{ID: id, ConversationID: spec.ConversationID, Language: spec.Language, Status: runbox.StatusQueued,
			Interactive: spec.Interactive, CreatedAt: now},
		Spec: spec, Task: task,
	}, nil
}

// atIndex names the run of a batch a refusal is about: every refusal of a
// run is the batch's invalid_argument (REST 400), with the run's reason.
func atIndex(i int, err error) error {
	var e *runbox.Error
	if !errors.As(err, &e) {
		return err
	}
	return runbox.Errorf(runbox.EInvalid, "runs[%d]: %s", i, e.Message)
}

// admitBatch holds a batch to its client's tier as a whole: run seconds
// today, new conversations an hour (all those it starts at once),
// storage, and the service's bound on conversations with a sandbox.
func (s *Service) admitBatch(ctx context.Context, keys []string) error {
	if err := s.admitRunSeconds(ctx); err != nil {
		return err
	}
	perHour := auth.Tier(ctx).NewConversationsPerHour
	wait, err := s.store.AllowConversations(ctx, client(ctx), keys, perHour)
	switch {
	case err != nil:
		return err
	case wait < 0:
		return runbox.Limited(runbox.ERateLimited, time.Hour,
			"the batch starts more new conversations than the %d an hour this client may start; name existing conversations, or split it", perHour)
	case wait > 0:
		return runbox.Limited(runbox.ERateLimited, wait,
			"this client may start %d new conversations an hour; retry later", perHour)
	}
	if err := s.admitStorage(ctx); err != nil {
		return err
	}
	return s.admitSandboxes(ctx)
}

// batchWindow bounds the client's runs queued or running at once that a
// batch's may join: its tier's concurrent_runs; without one, twice the
// slots of the live executors (at least minWindow), which keeps them busy
// while a large batch waits in order rather than filling asynq's queue.
func batchWindow(ctx context.Context, infos []runbox.ExecutorInfo) int {
	if n := auth.Tier(ctx).ConcurrentRuns; n > 0 {
		return n
	}
	slots := 0
	for _, i := range infos {
		slots += i.Concurrency
	}
	return max(minWindow, 2*slots)
}

// batch returns the record of a batch of the caller's.
func (s *Service) batch(ctx context.Context, id string) (runbox.BatchRecord, error) {
	if !batchIDPattern.MatchString(id) {
		return runbox.BatchRecord{}, ErrBatchNotFound
	}
	rec, err := s.store.Batch(ctx, id)
	if err != nil {
		return runbox.BatchRecord{}, err
	}
	if rec.Client != client(ctx) {
		return runbox.BatchRecord{}, ErrBatchNotFound
	}
	return rec, nil
}

// Batch returns a batch of the caller's: its counts.
func (s *Service) Batch(ctx context.Context, id string) (runbox.Batch, error) {
	rec, err := s.batch(ctx, id)
	return rec.Batch, err
}

// GetBatch returns a batch of the caller's and a page of its runs: limit
// (DefaultBatchPage if 0, at most MaxBatchPage) from cursor ("" the
// first page; NextCursor of the page before).
func (s *Service) GetBatch(ctx context.Context, id, cursor string, limit int) (BatchPage, error) {
	offset := 0
	if cursor != "" {
		n, err := strconv.Atoi(cursor)
		if err != nil || n < 0 || n > runbox.MaxBatchRuns {
			return BatchPage{}, runbox.Errorf(runbox.EInvalid, "cursor must be the next_cursor of a page")
		}
		offset = n
	}
	switch {
	case limit == 0:
		limit = DefaultBatchPage
	case limit < 0 || limit > MaxBatchPage:
		return BatchPage{}, runbox.Errorf(runbox.EInvalid, "limit must be between 1 and %d", MaxBatchPage)
	}
	rec, err := s.batch(ctx, id)
	if err != nil {
		return BatchPage{}, err
	}
	ids, err := s.store.BatchRuns(ctx, id, offset, limit)
	if err != nil {
		return BatchPage{}, err
	}
	runs, err := s.store.RunsOf(ctx, ids)
	if err != nil {
		return BatchPage{}, err
	}
	page := BatchPage{Batch: rec.Batch, Runs: make([]runbox.Run, 0, len(runs))}
	for _, r := range runs {
		// A run in another MCP session's conversation is left out, as
		// lists leave it out.
		if owns(ctx, r.ConversationID) {
			page.Runs = append(page.Runs, public(r))
		}
	}
	if next := offset + len(ids); len(ids) == limit && next < rec.Total {
		page.NextCursor = strconv.Itoa(next)
	}
	return page, nil
}

// CancelBatch cancels what has not ended of a batch of the caller's:
// runs waiting never start, running ones are asked to stop (they end
// shortly, cancelled). It returns the batch's counts afterwards.
func (s *Service) CancelBatch(ctx context.Context, id string) (runbox.Batch, error) {
	if _, err := s.batch(ctx, id); err != nil {
		return runbox.Batch{}, err
	}
	// First, so that the runs waiting for room are not let in meanwhile.
	if err := s.store.CancellingBatch(ctx, id); err != nil {
		return runbox.Batch{}, err
	}
	ids, err := s.store.BatchRuns(ctx, id, 0, 0)
	if err != nil {
		return runbox.Batch{}, err
	}
	runs, err := s.store.RunsOf(ctx, ids)
	if err != nil {
		return runbox.Batch{}, err
	}
	for _, run := range runs {
		if run.Status == runbox.StatusQueued {
			if run.Status, err = s.endQueued(ctx, run); err != nil {
				return runbox.Batch{}, err
			}
		}
		if run.Status == runbox.StatusRunning {
			if err := s.store.RequestCancel(ctx, run.ID, false); err != nil {
				return runbox.Batch{}, err
			}
		}
	}
	return s.Batch(ctx, id)
}
