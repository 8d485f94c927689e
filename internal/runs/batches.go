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
// fit waits its turn, in order. A batch is held whole to what its client
// may have waiting (its queue, and each conversation's waiting runs) and
// spend (its runs' timeouts within the day's run seconds left).

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
		IdempotencyKey: req.IdempotencyKey, Bounds: s.bounds(ctx), MaxWaiting: s.limits.MaxWaiting}
	if err := s.admitQueued(ctx, nb.Bounds, len(req.Runs), batchBytes(req)); err != nil {
		s.limited(ctx, err)
		return BatchCreated{}, err
	}
	keys := make([]string, 0, len(req.Runs))
	seconds := 0
	for i, r := range req.Runs {
		br, err := s.batchRun(ctx, r, names, now)
		if err != nil {
			return BatchCreated{}, atIndex(i, err)
		}
		nb.Runs = append(nb.Runs, br)
		keys = append(keys, br.Run.ConversationID)
		seconds += br.Spec.TimeoutSeconds
	}
	// The client's limits first: its callbacks' names are looked up
	// (seconds) only for a batch they admit.
	if err := s.admitBatch(ctx, keys, seconds); err != nil {
		s.limited(ctx, err)
		return BatchCreated{}, err
	}
	hooks, err := s.batchCallbacks(ctx, &nb, req.CallbackURL)
	if err != nil {
		return BatchCreated{}, err
	}
	if err := s.admitWebhooks(ctx, hooks); err != nil {
		return BatchCreated{}, err
	}
	id, created, err := s.store.CreateBatch(ctx, nb)
	if err != nil {
		s.limited(ctx, err)
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
	err := tierTimeout(ctx, &spec)
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

// admitBatch holds a batch to its client's tier as a whole: the seconds
// its runs' timeouts reserve within what is left of the day's, new
// conversations an hour (all those it starts at once), storage, and the
// service's bound on conversations with a sandbox (all those it starts).
// The store holds the rest as it records the batch: the client's queue,
// its conversations' waiting runs, and the seconds again, at once.
func (s *Service) admitBatch(ctx context.Context, keys []string, seconds int) error {
	left, err := s.secondsLeft(ctx)
	if err != nil {
		return err
	}
	if left >= 0 && seconds > left {
		perDay := auth.Tier(ctx).RunSecondsPerDay
		return runbox.Limited(runbox.EQuotaExceeded, activeRetry,
			"the batch's runs may take %d seconds (their timeouts, reserved until each ends), and this client has %d of its %d left today (UTC); give its runs a shorter timeout_seconds, or split it",
			seconds, left, perDay)
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
	return s.admitSandboxesFor(ctx, keys)
}

// admitQueued refuses a batch of n runs of bytes (batchBytes) before it
// is checked run by run when it is too large for a request, or cannot fit
// the client's queue: a client flooding its queue costs the service one
// round trip a batch. (The store holds the bounds exactly, as it records
// the batch: what a run holds in Redis is more than batchBytes counts.)
func (s *Service) admitQueued(ctx context.Context, b runbox.ClientBounds, n, bytes int) error {
	if bytes > runbox.MaxBatchBytes {
		// The bound of POST /v1/batches' body, for start_batch too.
		return runbox.Errorf(runbox.ETooLarge, "the batch's runs are %d bytes; a batch takes at most %d", bytes, runbox.MaxBatchBytes)
	}
	if b.MaxQueuedRuns == 0 && b.MaxQueuedBytes == 0 {
		return nil
	}
	runs, held, err := s.store.Queued(ctx, client(ctx))
	switch {
	case err != nil:
		return err
	case b.MaxQueuedRuns > 0 && runs+n > b.MaxQueuedRuns:
		return runbox.Limited(runbox.EBusy, activeRetry,
			"this client has %d runs waiting, and may have %d; the batch's %d do not fit: retry when some have started", runs, b.MaxQueuedRuns, n)
	case b.MaxQueuedBytes > 0 && held+int64(bytes) > b.MaxQueuedBytes:
		return runbox.Limited(runbox.EBusy, activeRetry,
			"this client's waiting runs hold %d bytes, and may hold %d; the batch's do not fit: retry when some have started", held, b.MaxQueuedBytes)
	}
	return nil
}

// batchBytes is about what a batch's runs hold, as their requests'
// bodies would: their programs, input, environment and names.
func batchBytes(req BatchRequest) int {
	n := 0
	for _, r := range req.Runs {
		n += len(r.Code) + len(r.Stdin) + len(r.ConversationID) + len(r.SessionID) + len(r.CallbackURL) + len(r.Language)
		for k, v := range r.Env {
			n += len(k) + len(v)
		}
		for _, p := range r.Packages {
			n += len(p)
		}
		for _, sec := range r.Secrets {
			n += len(sec)
		}
		if r.Network != nil {
			for _, d := range r.Network.AllowedDomains {
				n += len(d)
			}
		}
	}
	return n
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
		if !owns(ctx, run.ConversationID) {
			// In another MCP session's conversation: that session's to
			// cancel, as GetBatch leaves it out.
			continue
		}
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
