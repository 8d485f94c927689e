package executor

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"time"

	"github.com/hibiken/asynq"

	"github.com/runbox-dev/runbox"
	"github.com/runbox-dev/runbox/internal/agent"
	"github.com/runbox-dev/runbox/internal/files"
	"github.com/runbox-dev/runbox/internal/lifecycle"
	"github.com/runbox-dev/runbox/internal/queue"
	"github.com/runbox-dev/runbox/internal/sandbox"
	"github.com/runbox-dev/runbox/internal/store"
)

// ProcessTask runs one run task. It is asynq's handler.
func (e *Executor) ProcessTask(ctx context.Context, t *asynq.Task) error {
	p, err := queue.Decode(t)
	if err != nil {
		return fmt.Errorf("%w: %w", err, asynq.SkipRetry)
	}
	// A run this executor took when it was announced is running here
	// already: the task ends with it, so that the dashboard shows it
	// active while it runs.
	e.mu.Lock()
	ended, here := e.ended[p.RunID]
	e.mu.Unlock()
	if here {
		select {
		case <-ended:
		case <-ctx.Done():
		}
		return nil
	}
	select {
	case e.slots <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	}
	defer func() { <-e.slots }()
	return e.process(ctx, p.RunID)
}

// process claims run id and runs it, holding one of the executor's slots.
// ctx bounds the run (asynq's deadline and shutdown).
func (e *Executor) process(ctx context.Context, id string) error {
	spec, err := e.store.Spec(ctx, id)
	if errors.Is(err, store.ErrNotFound) {
		e.log.Warn("task for a run that does not exist", "run", id)
		return nil
	}
	if err != nil {
		return fmt.Errorf("read run: %w", err)
	}
	log := e.log.With("run", id, "conversation", spec.ConversationID, "language", spec.Language)

	// The run is registered as active before it is claimed, so that a
	// shutdown waits for it or ends it.
	runCtx, cancel := context.WithCancelCause(context.WithoutCancel(ctx))
	defer cancel(nil)
	e.mu.Lock()
	if _, dup := e.active[id]; dup {
		// Announced and handed out by asynq at once: one of them runs it.
		e.mu.Unlock()
		return nil
	}
	ended := make(chan struct{})
	e.active[id], e.ended[id] = cancel, ended
	e.mu.Unlock()
	defer func() {
		e.mu.Lock()
		delete(e.active, id)
		delete(e.ended, id)
		e.mu.Unlock()
		close(ended)
	}()
	// asynq cancels ctx when it gives up on the task (its deadline, or its
	// own shutdown timeout): the run ends then too.
	stop := context.AfterFunc(ctx, func() { cancel(ErrShutdown) })
	defer stop()

	ok, err := e.store.Claim(runCtx, id, e.cfg.ID, e.cfg.Lease)
	if err != nil {
		return fmt.Errorf("claim run: %w", err)
	}
	if !ok {
		// Cancelled before it started, or it already ran (asynq hands an
		// interrupted task out again): never run user code twice.
		log.Info("run is not queued any more; skipping")
		return nil
	}
	log.Debug("run started")
	stopWatch := e.watchQuota(runCtx, spec.ConversationID, cancel)
	res := e.run(runCtx, id, spec, log)
	stopWatch()
	e.metrics.observe(spec.Language, res.status, time.Duration(res.result.DurationMS)*time.Millisecond)
	return e.finish(id, spec.ConversationID, res, log)
}

// runState is what a run produced, for finish.
type runState struct {
	result  runbox.Result
	status  runbox.Status
	events  []runbox.Event
	failure error // a service error, logged
}

func (e *Executor) run(ctx context.Context, id string, spec runbox.Spec, log *slog.Logger) runState {
	st := runState{result: runbox.Result{RunID: id, ConversationID: spec.ConversationID, ExitCode: -1,
		Files: []runbox.FileInfo{}, Artifacts: []runbox.FileInfo{}}}
	fail := func(err error, msg string) runState {
		st.failure = err
		st.status = runbox.StatusError
		st.result.Error = msg
		st.events = append(st.events, runbox.Event{TS: time.Now(), Type: runbox.EventError, Message: msg})
		return st
	}

	// A new conversation takes a sandbox that is started already; so does
	// one without a sandbox here, its files moved (walk mode) or copied
	// (loop mode) into the sandbox's folder, which then takes the
	// conversation's name — never while another sandbox (another
	// language's, a kept interpreter) mounts the folder it has.
	adopted, asked := false, true
	existed := e.folders.Exists(spec.ConversationID)
	switch cid := spec.ConversationID; {
	case !existed:
		adopted = e.sandboxes.Adopt(cid, spec.Language, func(slot string) (string, error) { return e.folders.Adopt(slot, cid) })
	case !e.sandboxes.HasWarm(cid):
		adopted = e.sandboxes.Adopt(cid, spec.Language, func(slot string) (string, error) {
			dir, err := e.folders.MoveInto(slot, cid)
			if errors.Is(err, files.ErrSlotDirty) {
				err = fmt.Errorf("%w: %w", sandbox.ErrSpoiled, err)
			}
			return dir, err
		})
	default:
		asked = false
	}
	if asked { // taken or not, the pool may want another
		if !adopted {
			e.log.Debug("no pooled sandbox: starting one", "conversation", spec.ConversationID, "language", spec.Language)
		}
		select {
		case e.poolWake <- struct{}{}:
		default:
		}
	}
	dir, err := e.folders.Ensure(spec.ConversationID)
	if err != nil {
		return fail(err, "could not prepare the conversation's files")
	}
	if c := e.cfg.Copies; c != nil {
		if !existed {
			c.Forget(spec.ConversationID) // its folder was removed here
		}
		if err := c.Pull(ctx, spec.ConversationID); err != nil {
			return fail(err, "could not fetch the conversation's files from the file store")
		}
	}
	before, err := e.folders.List(spec.ConversationID)
	if err != nil {
		return fail(err, "could not read the conversation's files")
	}

	out := newOutput(e.cfg.MaxOutput, func(evs ...runbox.Event) {
		if err := e.store.Append(context.WithoutCancel(ctx), id, evs...); err != nil {
			log.Warn("publish output", "err", err)
		}
	})
	req := sandbox.Request{
		RunID:          id,
		ConversationID: spec.ConversationID,
		Language:       spec.Language,
		Code:           spec.Code,
		Env:            spec.Env,
		Timeout:        spec.Timeout(),
		DataDir:        dir,
		KeepState:      spec.KeepState,
	}
	switch {
	case spec.Interactive:
		// Input sent while it runs follows what came with the request.
		req.Stdin = io.MultiReader(strings.NewReader(spec.Stdin), e.store.Stdin(ctx, id))
	case spec.Stdin != "":
		req.Stdin = strings.NewReader(spec.Stdin)
	}
	oc, runErr := e.sandboxes.Run(ctx, req, out.write)
	out.flush()
	st.result.Stdout, st.result.StdoutTruncated = out.stdout.text()
	st.result.Stderr, st.result.StderrTruncated = out.stderr.text()
	st.result.Output = st.result.Stdout + st.result.Stderr
	st.result.DurationMS = oc.Duration.Milliseconds()
	after, err := e.folders.List(spec.ConversationID)
	if err != nil {
		return fail(err, "could not read the conversation's files")
	}
	st.result.Files = e.infos(spec.ConversationID, after)
	st.result.Artifacts = e.infos(spec.ConversationID, files.Changed(before, after))
	if c := e.cfg.Copies; c != nil {
		// Before the run's done: a client that reads the files then, or
		// a next run on another executor, finds them in the store.
		if err := c.Push(context.WithoutCancel(ctx), spec.ConversationID, before, after); err != nil {
			return fail(err, "could not save the conversation's files to the file store")
		}
	}
	if spec.KeepState && (oc.Kernel != "" || oc.StateLost) {
		lost, err := e.store.KeptState(context.WithoutCancel(ctx), spec.ConversationID, oc.Kernel == agent.KernelNew, oc.StateLost)
		if err != nil {
			log.Warn("record kept state", "err", err)
		}
		st.result.StateLost = lost
	}

	now := time.Now()
	if runErr != nil && ctx.Err() != nil {
		// Cancelled while its sandbox was starting.
		oc.Cancelled, runErr = true, nil
	}
	switch {
	case runErr != nil:
		return fail(runErr, "the sandbox failed while running the program")
	case oc.Cancelled:
		cause := context.Cause(ctx)
		if errors.Is(cause, errQuota) {
			msg := fmt.Sprintf("the conversation's files reached their quota of %d bytes; the program was stopped", e.folders.Quota())
			log.Warn("run stopped at the quota")
			st.status = runbox.StatusError
			st.result.Error = msg
			st.events = append(st.events, runbox.Event{TS: now, Type: runbox.EventError, Message: msg})
			return st
		}
		if !errors.Is(cause, context.Canceled) && cause != nil && !errors.Is(cause, errUserCancel) {
			return fail(cause, cause.Error())
		}
		st.status = runbox.StatusCancelled
		st.result.Cancelled = true
		st.events = append(st.events, runbox.Event{TS: now, Type: runbox.EventCancelled})
	case oc.TimedOut:
		st.status = runbox.StatusTimedOut
		st.result.TimedOut = true
		st.events = append(st.events, runbox.Event{TS: now, Type: runbox.EventTimeout,
			Message: fmt.Sprintf("the program ran longer than %ds and was killed", spec.TimeoutSeconds)})
	default:
		st.result.ExitCode = oc.ExitCode
		st.result.OOMKilled = oc.OOMKilled
		st.result.Phase = oc.Phase
		st.result.Success = oc.ExitCode == 0 && !oc.OOMKilled
		st.status = runbox.StatusFailed
		if st.result.Success {
			st.status = runbox.StatusSucceeded
		}
		code, ms := oc.ExitCode, oc.Duration.Milliseconds()
		st.events = append(st.events, runbox.Event{TS: now, Type: runbox.EventExit, ExitCode: &code, DurationMS: &ms})
	}
	return st
}

// errUserCancel is the cause of a cancellation a client asked for.
var errUserCancel = errors.New("cancelled")

// errQuota is the cause of stopping a run whose files reached the quota.
var errQuota = errors.New("quota exceeded")

// quotaCheckInterval is how often a run's folder is measured.
const quotaCheckInterval = 250 * time.Millisecond

// watchQuota stops the run when its conversation's files reach the
// quota. With loop-mounted images the kernel already refuses the writes;
// this ends the run and says why.
func (e *Executor) watchQuota(ctx context.Context, cid string, cancel context.CancelCauseFunc) (stop func()) {
	ctx, stopCtx := context.WithCancel(ctx)
	done := make(chan struct{})
	// A conversation already at its quota may still run programs (to
	// delete files): only growth past it stops a run.
	start, _, _ := e.folders.Usage(cid)
	// A full filesystem keeps a few blocks it will not give out.
	slack := max(64<<10, e.folders.Quota()/1000)
	go func() {
		defer close(done)
		lifecycle.Every(e.cfg.Clock, quotaCheckInterval, func(context.Context) {
			used, free, err := e.folders.Usage(cid)
			if err == nil && used > start && (free <= slack || used > e.folders.Quota()) {
				cancel(errQuota)
				stopCtx()
			}
		})(ctx)
	}()
	return func() { stopCtx(); <-done }
}

// finish records the result and the final events, and enqueues the
// conversation's next run. It uses its own context: the run's may be
// cancelled, and the result must still be written.
func (e *Executor) finish(runID, cid string, st runState, log *slog.Logger) error {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if st.failure != nil {
		log.Error("run failed", "err", st.failure)
	}
	// Before the next run is enqueued: it comes here, to the sandbox.
	if err := e.store.SetOwner(ctx, cid, e.cfg.ID, e.cfg.OwnerTTL); err != nil {
		log.Warn("record the conversation's executor", "err", err)
	}
	a, err := e.store.Finish(ctx, runID, store.Ending{
		From: []runbox.Status{runbox.StatusRunning}, Lease: store.LeaseDelete,
		Status: st.status, Result: &st.result, Events: st.events, Conversation: cid,
	})
	if err != nil {
		return fmt.Errorf("record result: %w", err)
	}
	if !a.Done {
		log.Warn("run was ended elsewhere before its result was recorded", "status", a.Status)
	}
	log.Info("run finished", "status", st.status, "exit_code", st.result.ExitCode, "duration_ms", st.result.DurationMS)
	if err := e.sched.Enqueue(ctx, a.Next); err != nil {
		// The sweep enqueues it shortly.
		log.Warn("enqueue the conversation's next run", "next", a.Next, "err", err)
	}
	return nil
}

func (e *Executor) infos(cid string, entries []files.Entry) []runbox.FileInfo {
	out := make([]runbox.FileInfo, len(entries))
	for i, en := range entries {
		out[i] = runbox.FileInfo{
			Name:      en.Name,
			Path:      "/data/" + en.Name,
			SizeBytes: en.Size,
			MimeType:  files.MimeType(en.Name),
			URL:       e.signer.URL(cid, en.Name),
		}
	}
	return out
}
