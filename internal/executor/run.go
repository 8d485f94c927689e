package executor

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"
	"time"

	"github.com/runbox-dev/runbox"
	"github.com/runbox-dev/runbox/internal/agent"
	"github.com/runbox-dev/runbox/internal/egress"
	"github.com/runbox-dev/runbox/internal/files"
	"github.com/runbox-dev/runbox/internal/lifecycle"
	"github.com/runbox-dev/runbox/internal/packages"
	"github.com/runbox-dev/runbox/internal/sandbox"
	"github.com/runbox-dev/runbox/internal/store"
)

// processTask runs the run of one task. It is the queue's handler.
func (e *Executor) processTask(ctx context.Context, id string) error {
	// A run this executor took when it was announced is running here
	// already: the task ends with it (or when it detaches), so that the
	// dashboard shows it active while it holds a slot.
	e.mu.Lock()
	a, here := e.active[id]
	e.mu.Unlock()
	if here {
		select {
		case <-a.ended:
		case <-a.detached:
		case <-ctx.Done():
		}
		return nil
	}
	sl, err := e.takeSlot(ctx)
	if err != nil {
		return err
	}
	defer sl.release()
	return e.process(ctx, id, sl)
}

// process claims run id and runs it, holding sl, one of the executor's
// slots. It returns when the run has ended, or detached (it then runs on
// in a goroutine of e.runs, and sl is given back). ctx bounds the run
// until it detaches (asynq's deadline and shutdown).
func (e *Executor) process(ctx context.Context, id string, sl *slot) error {
	c, err := e.claim(ctx, id)
	if c == nil {
		return err
	}
	defer c.unlink()
	spec, log := c.spec, c.log
	log.Debug("run started")
	var onStart func()
	if spec.Parallel || spec.Detach {
		onStart = func() { e.detach(c.ctx, id, spec.ConversationID, c.active, sl, log) }
	}
	finished := make(chan error, 1)
	e.runs.Go(func() {
		defer c.end()
		finished <- e.finish(id, c, e.watched(c, id, spec, log, onStart), log)
	})
	select {
	case err := <-finished:
		return err
	case <-c.active.detached:
		return nil
	}
}

// claimed is a run this executor claimed and registered as active.
type claimed struct {
	// spec is what to run, from the claim's reply; log names the run.
	spec runbox.Spec
	log  *slog.Logger
	// at is when it was claimed: when the claim recorded this executor as
	// its conversation's owner.
	at time.Time
	// ctx is the run's: cancelled with a cause when the run is to end.
	ctx    context.Context
	cancel context.CancelCauseFunc
	active *activeRun
	// end unregisters the run once it is over; unlink stops tying it to
	// the task's context (it detached, or it is over).
	end, unlink func()
}

// claim registers run id as active and claims it, learning what it is
// to run from the claim's reply: nil (and the error, if any) when it is
// not to run here — the executor stops, it runs already, its
// conversation runs elsewhere (it is handed over), or it is not queued
// any more.
func (e *Executor) claim(ctx context.Context, id string) (*claimed, error) {
	// The run is registered as active before it is claimed, so that a
	// shutdown waits for it or ends it.
	runCtx, cancel := context.WithCancelCause(context.WithoutCancel(ctx))
	a := &activeRun{cancel: cancel, ended: make(chan struct{}), detached: make(chan struct{})}
	e.mu.Lock()
	if e.stopping {
		// Shutting down: another executor takes it (the sweep enqueues
		// it again, for any executor).
		e.mu.Unlock()
		cancel(nil)
		e.log.Info("the executor is stopping: leaving the run to another", "run", id)
		return nil, nil
	}
	if _, dup := e.active[id]; dup || e.ended.has(id) {
		// Announced and handed out by asynq at once, or after it ended
		// here: one of them runs it.
		e.mu.Unlock()
		cancel(nil)
		return nil, nil
	}
	e.active[id] = a
	e.mu.Unlock()
	end := func() {
		e.mu.Lock()
		delete(e.active, id)
		if a.claimed {
			e.ended.add(id)
		}
		if a.isDetached {
			e.detached--
		}
		e.mu.Unlock()
		close(a.ended)
		cancel(nil)
	}
	// asynq cancels ctx when it gives up on the task (its deadline, or its
	// own shutdown timeout): the run ends then too — until it detaches.
	unlink := context.AfterFunc(ctx, func() { cancel(ErrShutdown) })

	at := e.cfg.Clock.Now()
	c, err := e.store.ClaimFor(runCtx, id, e.cfg.ID, e.cfg.Lease, e.cfg.OwnerTTL)
	log := e.log.With("run", id, "conversation", c.Spec.ConversationID, "language", c.Spec.Language)
	// The claim let the client's next runs go: they are enqueued before
	// this one runs, for a free slot to take.
	if err := e.sched.Enqueue(context.WithoutCancel(ctx), c.Dispatch...); err != nil {
		log.Warn("enqueue the runs the claim let go; the sweep will", "runs", c.Dispatch, "err", err)
	}
	if err == nil && c.OK {
		e.mu.Lock()
		a.claimed, a.conv = true, c.Spec.ConversationID
		e.mu.Unlock()
		return &claimed{spec: c.Spec, log: log, at: at, ctx: runCtx, cancel: cancel, active: a, end: end,
			unlink: func() { unlink() }}, nil
	}
	defer unlink()
	end()
	switch {
	case err != nil:
		return nil, fmt.Errorf("claim run: %w", err)
	case c.Elsewhere != "":
		// The conversation's other runs live on that executor, with its
		// folder: the run goes there.
		log.Debug("the conversation runs elsewhere; handing the run over", "to", c.Elsewhere)
		if err := e.sched.EnqueueFor(context.WithoutCancel(ctx), id, c.Spec, c.Elsewhere); err != nil {
			return nil, fmt.Errorf("hand the run over to %s: %w", c.Elsewhere, err)
		}
		return nil, nil
	case c.Status == "":
		e.log.Warn("task for a run that does not exist", "run", id)
		return nil, nil
	default:
		// Cancelled before it started, or it already ran (asynq hands an
		// interrupted task out again): never run user code twice.
		log.Info("run is not queued any more; skipping", "status", c.Status)
		return nil, nil
	}
}

// watched runs a claimed run with its watches — the quota, and a
// background run's idleness — and returns what it produced.
func (e *Executor) watched(c *claimed, id string, spec runbox.Spec, log *slog.Logger, onStart func()) runState {
	stopWatch := e.watchQuota(c.ctx, spec.ConversationID, c.cancel)
	stopIdle := func() {}
	if spec.Background {
		bg := e.backgrounds.add(id, spec.ConversationID, e.cfg.Clock.Now())
		defer e.backgrounds.remove(id)
		stopIdle = e.watchIdle(c.ctx, bg, c.cancel)
	}
	res := e.run(c.ctx, id, spec, log, onStart)
	stopIdle()
	if stopWatch() && res.failure == nil && (res.status == runbox.StatusSucceeded || res.status == runbox.StatusFailed) {
		log.Warn("run ended past the quota")
		res.atQuota(fmt.Sprintf("%d bytes", e.folders.Quota()), "", time.Now())
	}
	e.metrics.observe(spec.Language, res.status, time.Duration(res.result.DurationMS)*time.Millisecond)
	return res
}

// detach lets a run whose program has started go on without its slot
// and outside its conversation's order, if the executor has room for
// another detached run; the conversation's next run is enqueued.
func (e *Executor) detach(ctx context.Context, id, cid string, a *activeRun, sl *slot, log *slog.Logger) {
	e.mu.Lock()
	if e.detached >= e.cfg.MaxDetached {
		e.mu.Unlock()
		log.Info("detached runs at their limit: the run keeps its slot", "limit", e.cfg.MaxDetached)
		return
	}
	e.detached++
	a.isDetached = true
	e.mu.Unlock()
	next, err := e.store.Detach(context.WithoutCancel(ctx), id, cid)
	if err != nil {
		// It stays its conversation's head until it ends.
		log.Warn("record a detached run", "err", err)
	}
	sl.release()
	close(a.detached)
	if err := e.sched.Enqueue(context.WithoutCancel(ctx), next...); err != nil {
		log.Warn("enqueue the conversation's next run; the sweep will", "next", next, "err", err)
	}
}

// runState is what a run produced, for finish.
type runState struct {
	result  runbox.Result
	status  runbox.Status
	events  []runbox.Event
	failure error // a service error, logged
}

// fail makes st the result of a run the service failed (err, logged) and
// whose client is told msg.
func (st runState) fail(err error, msg string, now time.Time) runState {
	st.failure = err
	st.status = runbox.StatusError
	st.result.Error = msg
	st.events = append(st.events, runbox.Event{TS: now, Type: runbox.EventError, Message: msg})
	return st
}

// atQuota makes st the result of a run whose files went past the
// quota's bound ("N bytes", "N entries"): stopped there (quotaStopped),
// stopped by its sandbox's agent, its files not taken (quotaNotKept), or
// found at it once it had ended (watchQuota: "").
func (st *runState) atQuota(bound, then string, now time.Time) {
	msg := "the conversation's files reached their quota of " + bound + then
	st.status = runbox.StatusError
	st.result.Success = false
	st.result.Error = msg
	st.events = append(st.events, runbox.Event{TS: now, Type: runbox.EventError, Message: msg})
}

// What became of a run's program at its quota, for atQuota.
const (
	quotaStopped = "; the program was stopped"
	quotaNotKept = "; the program was stopped, and what it changed in them was not kept"
)

// run runs a claimed run to its end, stage by stage: its network
// (egress), its conversation's folder (workspace), its packages, its
// program (sandbox), what the program left (collect) and, from what
// happened, its status and final events (outcome). onStart, if set, is
// called once its program has started.
func (e *Executor) run(ctx context.Context, id string, spec runbox.Spec, log *slog.Logger, onStart func()) (st runState) {
	st = runState{result: runbox.Result{RunID: id, ConversationID: spec.ConversationID, ExitCode: -1,
		Files: []runbox.FileInfo{}, Artifacts: []runbox.FileInfo{}}}
	if spec.Pause {
		return e.pause(spec, st)
	}
	network, err := e.openEgress(ctx, id, spec, log)
	if err != nil {
		return st.fail(err, "the run's network could not be set up", time.Now())
	}
	if network != nil {
		// Whatever the ending, its connections end with it and are listed.
		defer func() { st.result.Egress = network.Close() }()
	}
	dir, before, release, err := e.prepare(ctx, id, spec)
	if pe, ok := errors.AsType[*prepareError](err); ok {
		return st.fail(pe.err, pe.msg, time.Now())
	}
	defer release()
	// The output is published as it comes, tried once: a program must not
	// wait for Redis. What is lost from the events while Redis cannot be
	// reached is in the result, and the outage is logged once.
	down := &outage{log: log, what: "publish output"}
	out := newOutput(e.cfg.MaxOutput, func(evs ...runbox.Event) {
		err := e.store.Append(context.WithoutCancel(ctx), id, evs...)
		switch {
		case store.Transient(err):
			down.failed(e.cfg.Clock.Now(), err)
		case err != nil:
			log.Warn("publish output", "err", err)
		default:
			down.over(e.cfg.Clock.Now())
		}
	})
	oc, msg, err := e.packages(ctx, id, spec, dir, network, &st, log)
	if msg != "" {
		return st.fail(err, msg, time.Now())
	}
	var runErr error
	if !oc.Cancelled { // a cancelled install is the run's end
		oc, runErr = e.sandboxes.Run(ctx, e.request(ctx, id, spec, dir, onStart), e.writer(id, out))
	}
	release()
	if msg, err := e.collect(ctx, spec, before, out, oc, &st, log); msg != "" {
		return st.fail(err, msg, time.Now())
	}
	cause := context.Cause(ctx)
	if oc.Cancelled && errors.Is(cause, errQuota) {
		log.Warn("run stopped at the quota")
	}
	return outcome(st, ending{outcome: oc, err: runErr, cause: cause, timeout: spec.TimeoutSeconds,
		quota: e.folders.Quota(), files: e.cfg.QuotaFiles, idle: e.idleMessage(), now: time.Now()})
}

// packages installs the run's packages, if it asks for any, and then
// narrows its network to what its program asked for. It returns how the
// installer ended and, if the install failed, the run's error.
func (e *Executor) packages(ctx context.Context, id string, spec runbox.Spec, dir string, network *egress.Run,
	st *runState, log *slog.Logger) (sandbox.Outcome, string, error) {
	if len(spec.Packages) == 0 {
		return sandbox.Outcome{}, "", nil
	}
	oc, msg, err := e.install(ctx, id, spec, dir)
	if msg != "" {
		return oc, msg, err
	}
	installed, err := packages.Installed(dir, spec.Language)
	if err != nil {
		log.Warn("list the installed packages", "err", err)
	}
	st.result.Packages = installed
	if network != nil {
		// The program reaches only what it asked for, with its secrets.
		grant, secrets, _ := e.programGrant(spec) // as openEgress did
		network.Allow(grant)
		network.UseSecrets(secrets)
	}
	return oc, "", nil
}

// request is what the sandbox is asked to run.
func (e *Executor) request(ctx context.Context, id string, spec runbox.Spec, dir string, onStart func()) sandbox.Request {
	req := sandbox.Request{
		RunID:          id,
		ConversationID: spec.ConversationID,
		Language:       spec.Language,
		Code:           spec.Code,
		Env:            e.programEnv(spec),
		Trust:          e.programTrust(spec),
		Timeout:        spec.Timeout(),
		DataDir:        dir,
		KeepState:      spec.KeepState,
		Filesystem:     rules(spec.Filesystem),
		OnStart:        onStart,
	}
	switch {
	case spec.Interactive:
		// Input sent while it runs follows what came with the request.
		req.Stdin = io.MultiReader(strings.NewReader(spec.Stdin), e.store.Stdin(ctx, id))
	case spec.Stdin != "":
		req.Stdin = strings.NewReader(spec.Stdin)
	}
	return req
}

// writer is where the program's output goes: the run's events, and a
// background run's tail.
func (e *Executor) writer(id string, out *output) sandbox.Output {
	if bg := e.backgrounds.get(id); bg != nil {
		return func(s sandbox.Stream, p []byte) { out.write(s, p); bg.write(s, p, e.cfg.Clock.Now()) }
	}
	return out.write
}

// collect puts what the program left in the run's result: its output,
// the conversation's files and those it changed (saved to the file store
// first, with a remote one), and whether a kept interpreter's state
// survived. It returns the run's error if the files cannot be had.
func (e *Executor) collect(ctx context.Context, spec runbox.Spec, before []files.Entry, out *output, oc sandbox.Outcome,
	st *runState, log *slog.Logger) (string, error) {
	// Recorded with the run's end, which waits for Redis if it must.
	st.events = append(st.events, out.rest()...)
	st.result.Stdout, st.result.StdoutTruncated = out.stdout.text()
	st.result.Stderr, st.result.StderrTruncated = out.stderr.text()
	st.result.Output = st.result.Stdout + st.result.Stderr
	st.result.DurationMS = oc.Duration.Milliseconds()
	after, err := e.folders.List(spec.ConversationID)
	if err != nil {
		return "could not read the conversation's files", err
	}
	st.result.Files = e.infos(spec.ConversationID, after)
	st.result.Artifacts = e.infos(spec.ConversationID, files.Changed(before, after))
	if c := e.cfg.Copies; c != nil {
		// Before the run's done: a client that reads the files then, or
		// a next run on another executor, finds them in the store.
		unlock := e.convs.lock(spec.ConversationID)
		err := c.Push(context.WithoutCancel(ctx), spec.ConversationID, before, after)
		unlock()
		if err != nil {
			return storeMessage("could not save the conversation's files to the file store", err), err
		}
	}
	if spec.KeepState && (oc.Kernel != "" || oc.StateLost) {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), finishLimit)
		defer cancel()
		var lost bool
		err := e.retry.do(ctx, e.halted, &outage{log: log, what: "record kept state"}, func(ctx context.Context) (err error) {
			lost, err = e.store.KeptState(ctx, spec.ConversationID, oc.Kernel == agent.KernelNew, oc.StateLost)
			return err
		})
		if err != nil {
			log.Warn("record kept state", "err", err)
		}
		st.result.StateLost = lost
		st.result.StateRestored, st.result.LostVariables = oc.StateRestored, oc.LostVariables
	}
	return "", nil
}

// rules are a run's filesystem rules as the agent takes them.
func rules(f *runbox.Filesystem) *agent.Rules {
	if f == nil {
		return nil
	}
	return &agent.Rules{AllowWrite: f.AllowWrite, DenyRead: f.DenyRead, DenyWrite: f.DenyWrite}
}

// storeMessage is what a run's client is told of a copy to or from the
// file store that failed: msg, or the refusal of files past the quota
// (their bytes and the quota, nothing of the host).
func storeMessage(msg string, err error) string {
	if re, ok := errors.AsType[*runbox.Error](err); ok && re.Code == runbox.EQuotaExceeded {
		return re.Message
	}
	return msg
}

// prepareError is a failure to prepare a run's folder, with what its
// client is told.
type prepareError struct {
	msg string
	err error
}

func (e *prepareError) Error() string { return e.msg + ": " + e.err.Error() }
func (e *prepareError) Unwrap() error { return e.err }

// prepare makes the conversation's folder ready for a run and returns
// it, its listing before the run, and the release of the run's hold on
// the conversation's sandboxes (sandbox.Manager.Hold), to be called once
// the program is over. Runs of one conversation prepare one at a time.
//
// A new conversation takes a sandbox that is started already; so does
// one without a sandbox here, its files moved (walk mode) or copied (loop
// mode) into the sandbox's folder, which then takes the conversation's
// name — never while another sandbox (another language's, a kept
// interpreter, a run under way) mounts the folder it has.
func (e *Executor) prepare(ctx context.Context, id string, spec runbox.Spec) (string, []files.Entry, func(), error) {
	cid := spec.ConversationID
	unlock := e.convs.lock(cid)
	defer unlock()
	adopted, asked := false, true
	existed := e.folders.Exists(cid)
	switch {
	case !existed:
		adopted = e.sandboxes.Adopt(ctx, cid, spec.Language, func(slot string) (string, error) { return e.folders.Adopt(slot, cid) })
	case !e.sandboxes.HasSandbox(cid):
		adopted = e.sandboxes.Adopt(ctx, cid, spec.Language, func(slot string) (string, error) {
			dir, err := e.folders.MoveInto(slot, cid)
			if errors.Is(err, files.ErrSlotDirty) {
				err = fmt.Errorf("%w: %w", sandbox.ErrSpoiled, err)
			}
			return dir, err
		})
	default:
		asked = false
	}
	if asked && !adopted {
		e.log.Debug("no pooled sandbox: starting one", "conversation", cid, "language", spec.Language)
	}
	dir, err := e.folders.Ensure(cid)
	if err != nil {
		return "", nil, nil, &prepareError{"could not prepare the conversation's files", err}
	}
	if c := e.cfg.Copies; c != nil {
		if !existed {
			c.Forget(cid) // its folder was removed here
		}
		if err := c.Pull(ctx, cid, e.othersRunning(cid, id)); err != nil {
			return "", nil, nil, &prepareError{storeMessage("could not fetch the conversation's files from the file store", err), err}
		}
	}
	before, err := e.folders.List(cid)
	if err != nil {
		return "", nil, nil, &prepareError{"could not read the conversation's files", err}
	}
	return dir, before, e.sandboxes.Hold(cid), nil
}

// othersRunning reports whether runs of conversation cid other than id
// are active here (parallel, detached or background runs): their
// programs may be writing its folder.
func (e *Executor) othersRunning(cid, id string) bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	for other, a := range e.active {
		if other != id && a.conv == cid {
			return true
		}
	}
	return false
}

// errUserCancel is the cause of a cancellation a client asked for;
// errUserTerm of one that asks the program to stop first.
var (
	errUserCancel = errors.New("cancelled")
	errUserTerm   = fmt.Errorf("%w: %w", errUserCancel, sandbox.ErrTerminate)
)

// userCancel is the cause of a client's cancellation.
func userCancel(c runbox.CancelRequest) error {
	if c.Graceful {
		return errUserTerm
	}
	return errUserCancel
}

// errQuota is the cause of stopping a run whose files reached the quota.
var errQuota = errors.New("quota exceeded")

// quotaCheckInterval is how often a run's folder is measured.
const quotaCheckInterval = 250 * time.Millisecond

// watchQuota stops the run when its conversation's files reach the
// quota. With loop-mounted images the kernel already refuses the writes;
// this ends the run and says why. Measured every quotaCheckInterval, a
// run can reach the quota and end between two measurements (a fast
// install of many small files does), or a measurement can find it there
// just after its program ended, too late to stop it: stop ends the watch
// and reports whether the run's files reached the quota (found by a
// measurement, or by one more now), so that a run's outcome never depends
// on when a measurement fell. A run stopped for it is reported so already
// (run); the caller reports the others.
func (e *Executor) watchQuota(ctx context.Context, cid string, cancel context.CancelCauseFunc) (stop func() (over bool)) {
	runCtx := ctx
	ctx, stopCtx := context.WithCancel(ctx)
	done := make(chan struct{})
	// A conversation already at its quota may still run programs (to
	// delete files): only growth past it stops a run.
	start, _, _ := e.folders.Usage(cid)
	// A full filesystem keeps a few blocks it will not give out.
	slack := max(64<<10, e.folders.Quota()/1000)
	past := func() bool {
		used, free, err := e.folders.Usage(cid)
		if errors.Is(err, files.ErrUnmeasurable) {
			// What the run adds cannot be told from nothing.
			return true
		}
		return err == nil && used > start && (free <= slack || used > e.folders.Quota())
	}
	go func() {
		defer close(done)
		lifecycle.Every(e.cfg.Clock, quotaCheckInterval, func(context.Context) {
			if past() {
				cancel(errQuota)
				stopCtx()
			}
		})(ctx)
	}()
	return func() bool {
		stopCtx()
		<-done
		return errors.Is(context.Cause(runCtx), errQuota) || past()
	}
}

// ownerRefresh is how long after its claim a run's end records its
// executor as its conversation's owner again: the claim did for OwnerTTL,
// and a shorter run would only move that expiry by less than this.
func ownerRefresh(ttl time.Duration) time.Duration { return ttl / 100 }

// finishLimit bounds how long a run's end waits for Redis to take it:
// well past a restart of Redis, even one that reads back a large AOF,
// but not for ever.
const finishLimit = 2 * time.Minute

// finish records the result and the final events, and enqueues the
// conversation's next run. It uses its own context: the run's may be
// cancelled, and the result must still be written.
//
// While Redis cannot be reached (it restarts, crashes, fails over) the
// writes are tried again, for up to finishLimit, or until a stopping
// executor stops waiting for its runs (halted): the run stays active
// meanwhile, and the heartbeat renews its lease, so that the watchdog
// does not end it as lost and its result is kept.
func (e *Executor) finish(runID string, c *claimed, st runState, log *slog.Logger) error {
	ctx, cancel := context.WithTimeout(context.Background(), finishLimit)
	defer cancel()
	down := &outage{log: log, what: "record result"}
	stored := func(op func(context.Context) error) error { return e.retry.do(ctx, e.halted, down, op) }
	cid := c.spec.ConversationID
	if st.failure != nil {
		log.Error("run failed", "err", st.failure)
	}
	// Before the next run is enqueued: it comes here, to the sandbox. The
	// claim recorded it; a long run's end records it again, so that it
	// lasts as long as the idle sandbox — unless this executor stops: then
	// it goes to another, which restores the kept interpreter saved now.
	if e.isStopping() {
		if _, err := e.sandboxes.Pause(cid); err != nil {
			log.Warn("save the kept interpreter of a stopping executor", "err", err)
		}
	}
	if e.cfg.Clock.Since(c.at) > ownerRefresh(e.cfg.OwnerTTL) {
		err := stored(func(ctx context.Context) error { return e.store.SetOwner(ctx, cid, e.cfg.ID, e.cfg.OwnerTTL) })
		if err != nil {
			log.Warn("record the conversation's executor", "err", err)
		}
	}
	var a runbox.Applied
	err := stored(func(ctx context.Context) (err error) {
		a, err = e.store.Finish(ctx, runID, runbox.Ending{
			From: []runbox.Status{runbox.StatusRunning}, Lease: runbox.LeaseDelete,
			Status: st.status, Result: &st.result, Events: st.events, Conversation: cid,
		})
		return err
	})
	if err != nil {
		return fmt.Errorf("record result: %w", err)
	}
	if !a.Done {
		log.Warn("run was ended elsewhere before its result was recorded", "status", a.Status)
	}
	log.Info("run finished", "status", st.status, "exit_code", st.result.ExitCode, "duration_ms", st.result.DurationMS)
	// Tried once: Redis answered just now, and should this fail the
	// sweep enqueues it shortly.
	if err := e.sched.Enqueue(ctx, a.Dispatch...); err != nil {
		log.Warn("enqueue the runs the end let go", "runs", a.Dispatch, "err", err)
	}
	return nil
}

func (e *Executor) infos(cid string, entries []files.Entry) []runbox.FileInfo {
	out := make([]runbox.FileInfo, len(entries))
	for i, en := range entries {
		out[i] = e.signer.Info(cid, en)
	}
	return out
}
