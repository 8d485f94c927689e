// Package executor runs queued programs: it takes run tasks from the queue,
// claims each run in the store so that it never runs twice, runs it in a
// sandbox, streams its output as events, and records the result with the
// files the program wrote.
package executor

import (
	"cmp"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/jonboulle/clockwork"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/runbox-dev/runbox"
	"github.com/runbox-dev/runbox/internal/files"
	"github.com/runbox-dev/runbox/internal/lifecycle"
	"github.com/runbox-dev/runbox/internal/sandbox"
	"github.com/runbox-dev/runbox/internal/sandbox/engine"
	"github.com/runbox-dev/runbox/internal/store"
	"github.com/runbox-dev/runbox/internal/watchdog"
	"github.com/runbox-dev/runbox/internal/workcopy"
)

// Defaults of Config.
const (
	DefaultLease             = 8 * time.Second
	DefaultHeartbeatInterval = 2 * time.Second
	DefaultPollInterval      = 20 * time.Millisecond
	DefaultMaxDetached       = 32
	DefaultServerIdle        = time.Hour
)

// Causes of a run's cancellation.
var (
	ErrShutdown  = errors.New("the executor shut down before the program finished")
	ErrLeaseLost = errors.New("the run was declared lost")
)

// Config configures an Executor.
type Config struct {
	ID            string
	Concurrency   int
	MaxOutput     int           // bytes of each of stdout and stderr kept
	ShutdownGrace time.Duration // how long running programs may finish on shutdown
	// Lease is how long a run stays claimed without a heartbeat; a run
	// whose executor dies is declared lost this long after its last one.
	Lease             time.Duration
	HeartbeatInterval time.Duration
	// PollInterval is how often an idle worker asks Redis for a task.
	PollInterval time.Duration
	// Metrics, if set, receives the executor's metrics.
	Metrics prometheus.Registerer
	// Pool is how many sandboxes of each language wait, started, for new
	// conversations.
	Pool sandbox.WarmLimits
	// Clock drives the background parts (a fake one in tests).
	Clock clockwork.Clock
	// Schedule runs the deployment's maintenance (the watchdog): while
	// this process leads (leader.Elector.Every); every process's own on
	// Clock if nil.
	Schedule lifecycle.Schedule
	// OwnerTTL is how long a conversation's next runs come to this
	// executor after its last one here: as long as its sandbox idles
	// (sandbox.DefaultIdleTTL if 0), and ownerGrace more.
	OwnerTTL time.Duration
	// Copies, when set, keep the conversations' folders here as working
	// copies of a remote file store (FILE_STORE=s3://…): pulled before a
	// run, what it changed pushed before its done.
	Copies *workcopy.Copies
	// MaxDetached bounds the runs that have given back their slot and run
	// on (runbox.Spec.Parallel, Detach); past it a run keeps its slot to
	// its end (DefaultMaxDetached if 0).
	MaxDetached int
	// Egress, when set, lets runs that ask for network or packages out
	// through its proxy, which the executor starts and stops.
	Egress *Egress
	// ServerIdle ends a background run idle this long (SANDBOX_SERVER_TTL;
	// DefaultServerIdle if 0).
	ServerIdle time.Duration
	// LinkAddr is where the api reaches this executor's sandboxes
	// (package link), announced with its heartbeat; empty when the api
	// runs it in its own process.
	LinkAddr string
	// QuotaFiles is the entries a conversation's files may hold
	// (SANDBOX_QUOTA_FILES), for the error of a run stopped past them.
	QuotaFiles int
}

// Executor takes runs off the queue and runs them.
type Executor struct {
	cfg       Config
	store     Store
	sandboxes Sandboxes
	folders   Workspace
	signer    *files.Signer
	sched     Scheduler
	log       *slog.Logger

	tasks Tasks
	// serving: Start has started taking tasks, which Shutdown stops.
	serving bool
	runners []runbox.Runner
	started time.Time
	// landlock says that its sandboxes hold programs to filesystem rules.
	landlock bool

	metrics *metrics

	// backgrounds are the background runs running here (tail.go).
	backgrounds backgrounds

	// slots bound the runs this executor runs at once, whether asynq
	// handed them out or an announcement did (wake.go).
	slots chan struct{}

	mu       sync.Mutex
	active   map[string]*activeRun // by run id
	detached int                   // active runs that detached
	stopping bool                  // Shutdown has begun: no run is claimed
	ended    recentRuns            // runs claimed here that have ended

	// convs serialises what runs of one conversation do to its folder
	// before and after their programs (adopting a sandbox, pulling and
	// pushing a working copy); the programs themselves run side by side.
	convs keyedMutex

	// announced takes the runs announced as they are enqueued (wake.go);
	// runs holds the goroutines of those it took.
	announced announcements
	runs      sync.WaitGroup

	background lifecycle.Group // heartbeat, janitor, watchdog, pool, listeners
	reaper     *peerReaper     // of the janitor; also at shutdown

	// retry tries again the writes Redis could not take (retry.go);
	// halted closes when Shutdown stops waiting for the runs, which then
	// try their ends' writes once.
	retry  retry
	halted chan struct{}
	halt   sync.Once
	// beats is the heartbeat's outage, logged once however many beats
	// fail.
	beats outage
}

// Tasks hands the executor the run tasks of its queues (*queue.Worker).
type Tasks interface {
	// Start hands handle the runs queued for this executor or for any,
	// concurrency at once, asking every poll when idle.
	Start(concurrency int, poll time.Duration, handle func(ctx context.Context, runID string) error) error
	// Stop stops taking tasks; Shutdown waits for those being handled.
	Stop()
	Shutdown()
	// RemoveQueue removes the executor's own queue when nothing waits
	// in it.
	RemoveQueue()
}

// Scheduler enqueues runs as their conversations move on
// (*queue.Scheduler).
type Scheduler interface {
	watchdog.Scheduler
	// EnqueueFor queues a run, whose spec is given, for executor.
	EnqueueFor(ctx context.Context, id string, spec runbox.Spec, executor string) error
}

// New returns an Executor that takes its runs from tasks. Start starts it.
func New(cfg Config, tasks Tasks, st Store, sched Scheduler, sandboxes Sandboxes,
	folders Workspace, signer *files.Signer, log *slog.Logger) *Executor {
	if cfg.Lease == 0 {
		cfg.Lease = DefaultLease
	}
	if cfg.HeartbeatInterval == 0 {
		cfg.HeartbeatInterval = DefaultHeartbeatInterval
	}
	if cfg.PollInterval == 0 {
		cfg.PollInterval = DefaultPollInterval
	}
	cfg.OwnerTTL = cmp.Or(cfg.OwnerTTL, sandbox.DefaultIdleTTL) + ownerGrace
	if cfg.ServerIdle == 0 {
		cfg.ServerIdle = DefaultServerIdle
	}
	if cfg.MaxDetached == 0 {
		cfg.MaxDetached = DefaultMaxDetached
	}
	if cfg.Clock == nil {
		cfg.Clock = clockwork.NewRealClock()
	}
	if cfg.Schedule == nil {
		cfg.Schedule = lifecycle.Periodic(cfg.Clock)
	}
	e := &Executor{
		cfg: cfg, store: st, sched: sched, sandboxes: sandboxes, folders: folders, signer: signer,
		log: log.With("executor", cfg.ID), tasks: tasks, active: map[string]*activeRun{},
		slots: make(chan struct{}, max(cfg.Concurrency, 1)), convs: keyedMutex{m: map[string]*keyedEntry{}},
		metrics: newMetrics(cfg.Metrics, sandboxes.Warm, sandboxes.Live),
		retry:   retry{clock: cfg.Clock, first: retryFirst, most: retryMost}, halted: make(chan struct{}),
	}
	e.beats = outage{log: e.log, what: "heartbeat"}
	e.announced = announcements{
		await: func(ctx context.Context, d time.Duration, mine bool) (string, error) {
			return e.store.AwaitWake(ctx, d, cfg.ID, mine)
		},
		process: e.process, slots: e.slots, runs: &e.runs, count: e.metrics.announced, clock: cfg.Clock, log: e.log,
	}
	return e
}

// Start discovers the runner images, removes containers an earlier process
// of this executor left behind, registers the executor, and starts taking
// runs.
func (e *Executor) Start(ctx context.Context) error {
	runners, err := e.sandboxes.Discover(ctx)
	if err != nil {
		return err
	}
	if len(runners) == 0 {
		return errors.New("no runner images found (labelled sandbox.runner=true): run `make images`")
	}
	e.runners = runners
	switch err := e.sandboxes.CheckRuntime(ctx, runners[0].Image); {
	case errors.Is(err, engine.ErrNoRoom):
		// Not the runtime's fault: the engine is full, maybe of this
		// executor's own orphans, which the reap below removes; a
		// crash here would only restart into the same full engine.
		e.log.Warn("the sandbox runtime could not be checked: no room for a sandbox", "err", err)
	case err != nil:
		return err
	}
	e.landlock = e.sandboxes.Landlock()
	if n, err := e.sandboxes.Reap(ctx, 0); err != nil {
		return fmt.Errorf("reap orphaned sandboxes: %w", err)
	} else if n > 0 {
		e.log.Info("removed orphaned sandboxes", "count", n)
	}
	if err := e.folders.RemoveSlots(e.slotPrefix()); err != nil {
		e.log.Warn("remove the slots of an earlier process", "err", err)
	}
	e.started = time.Now()
	// An earlier process under this id may have been killed while it
	// stopped, its draining mark still set.
	if err := e.store.Unregister(ctx, e.cfg.ID); err != nil {
		return fmt.Errorf("clear an earlier registration: %w", err)
	}
	if err := e.register(ctx); err != nil {
		return err
	}

	e.serving = true
	if err := e.tasks.Start(e.cfg.Concurrency, e.cfg.PollInterval, e.processTask); err != nil {
		return err
	}

	// The background parts outlive the start's context: Shutdown stops
	// them, in reverse order.
	e.background = e.backgroundParts()
	if err := e.background.Start(context.WithoutCancel(ctx)); err != nil {
		e.tasks.Shutdown()
		return err
	}
	if err := e.announced.Start(context.WithoutCancel(ctx)); err != nil {
		e.tasks.Shutdown()
		e.background.Stop()
		return err
	}
	quota := "walk"
	if e.folders.HardQuota() {
		quota = "loop"
	}
	e.log.Info("executor started", "concurrency", e.cfg.Concurrency, "runners", languages(runners), "quota", quota)
	if err := e.folders.QuotaFallback(); err != nil {
		// An operator who expects the kernel to hold quotas learns why it does not.
		e.log.Warn("quotas are measured, not loop-mounted (SANDBOX_QUOTA_MODE=auto)", "reason", err)
	}
	return nil
}

// slotPrefix names this executor's slots; '~' is in no executor id.
func (e *Executor) slotPrefix() string { return SlotPrefix(e.cfg.ID) }

// SlotPrefix starts the names of an executor's slots: those it removes at
// start and on shutdown.
func SlotPrefix(executor string) string { return executor + "~" }

// NewSlotName returns a fresh name for a slot of executor.
func NewSlotName(executor string) string {
	return SlotPrefix(executor) + strings.ToLower(rand.Text()[:10])
}

// backgroundParts are the executor's parts that run beside its runs, each
// given what it uses: the heartbeat, the sandbox janitor (and the peers'
// reaper it shares with Shutdown), the watchdog, the pool filler, the
// subscriptions to cancellations and closed conversations, and the egress
// proxy first of all.
func (e *Executor) backgroundParts() lifecycle.Group {
	wd := watchdog.New(e.store, e.sched, e.cfg.Schedule, e.log)
	e.reaper = &peerReaper{sandboxes: e.sandboxes, store: e.store, slots: e.folders, endLost: wd.Check,
		interval: e.cfg.HeartbeatInterval, clock: e.cfg.Clock, log: e.log}
	parts := lifecycle.Group{
		&heartbeat{beat: e.renew, interval: e.cfg.HeartbeatInterval, clock: e.cfg.Clock},
		&sandboxJanitor{sandboxes: e.sandboxes, peers: e.reaper, clock: e.cfg.Clock, log: e.log},
		wd,
		&poolFiller{sandboxes: e.sandboxes, slots: e.folders, runners: e.runners, pool: e.cfg.Pool, executor: e.cfg.ID,
			wants: e.sandboxes.PoolWants(), clock: e.cfg.Clock, log: e.log},
		&subscriber{name: "cancellations", subscribe: e.store.SubscribeCancels,
			handle: func(msg string) {
				c := store.ParseCancel(msg)
				e.cancel(c.ID, userCancel(c))
			}, log: e.log},
		&subscriber{name: "closed conversations", subscribe: e.store.SubscribeClosed, handle: e.dropClosed, log: e.log},
	}
	if eg := e.cfg.Egress; eg != nil && eg.Proxy != nil {
		// First started, last stopped: runs use it until they end.
		parts = append(lifecycle.Group{eg.Proxy}, parts...)
	}
	return parts
}

// dropClosed removes the warm sandboxes of a conversation a client closed.
func (e *Executor) dropClosed(cid string) {
	if n := e.sandboxes.Drop(cid); n > 0 {
		e.log.Info("removed the sandboxes of a closed conversation", "conversation", cid, "count", n)
	}
}

func (e *Executor) cancel(id string, cause error) {
	e.mu.Lock()
	a := e.active[id]
	e.mu.Unlock()
	if a != nil {
		a.cancel(cause)
	}
}

// cancelAll ends every active run with cause.
func (e *Executor) cancelAll(cause error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, a := range e.active {
		a.cancel(cause)
	}
}

// ownerGrace keeps a conversation's runs here past its sandbox's idle
// TTL for as long as the janitor may take to notice (pruneInterval) and
// to save its kept interpreter (sandbox.PauseTimeout): a run that went to
// another executor while the interpreter still lived here would start a
// new one there, and this one's state would be lost.
const ownerGrace = pruneInterval + sandbox.PauseTimeout

// sandboxRemoval bounds how long a stopping executor waits for the
// engine to remove its sandboxes.
const sandboxRemoval = 90 * time.Second

// Shutdown stops taking runs, lets running ones finish for the grace
// period, then kills the rest and ends them as errors, so that none is left
// running and none runs again. It returns when every sandbox is removed:
// its own, and those its dead peers left on this host (peers.go).
func (e *Executor) Shutdown(ctx context.Context) {
	if !e.serving {
		return
	}
	// From here no run is claimed (process): one that asynq hands a
	// handler still waiting for a slot stays queued, and goes, with the
	// conversations this executor owns, to another executor.
	e.mu.Lock()
	e.stopping = true
	e.mu.Unlock()
	// Before its conversations may go elsewhere (Drain): the kept
	// interpreters idle here are saved first, and restored where their
	// next runs go while this executor still finishes its runs. Those of
	// the runs under way are saved as each ends (finish).
	if err := e.sandboxes.PauseAll(); err != nil {
		e.log.Warn("save the kept interpreters of a stopping executor", "err", err)
	}
	dctx, dcancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
	if err := e.store.Drain(dctx, e.cfg.ID, e.cfg.ShutdownGrace+sandboxRemoval+time.Minute); err != nil {
		e.log.Warn("mark the executor draining", "err", err)
	}
	dcancel()
	e.announced.Stop()
	e.tasks.Stop()
	grace := time.NewTimer(e.cfg.ShutdownGrace)
	defer grace.Stop()
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
wait:
	for e.activeCount() > 0 {
		select {
		case <-grace.C:
			break wait
		case <-ctx.Done():
			break wait
		case <-tick.C:
		}
	}
	// Runs whose ends wait for Redis wait no longer.
	e.halt.Do(func() { close(e.halted) })
	if n := e.activeCount(); n > 0 {
		e.log.Warn("shutdown grace over: stopping running programs", "count", n)
		e.cancelAll(ErrShutdown)
		for e.activeCount() > 0 {
			<-tick.C
		}
	}
	e.tasks.Shutdown()
	e.tasks.RemoveQueue()
	// A handler asynq was starting as the wait above ended may have
	// started a run (and detached it) since.
	e.cancelAll(ErrShutdown)
	e.runs.Wait()
	e.background.Stop()
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer cancel()
	if err := e.store.Unregister(cctx, e.cfg.ID); err != nil {
		e.log.Warn("unregister", "err", err)
	}
	// The engine may take its time removing them: longer than the rest.
	sctx, scancel := context.WithTimeout(context.WithoutCancel(ctx), sandboxRemoval)
	defer scancel()
	if err := e.sandboxes.Shutdown(sctx); err != nil {
		e.log.Warn("remove sandboxes", "err", err)
	}
	if err := e.folders.RemoveSlots(e.slotPrefix()); err != nil {
		e.log.Warn("remove slots", "err", err)
	}
	rctx, rcancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
	defer rcancel()
	e.reaper.atShutdown(rctx)
	e.log.Info("executor stopped")
}

func (e *Executor) isStopping() bool {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.stopping
}

func (e *Executor) activeCount() int {
	e.mu.Lock()
	defer e.mu.Unlock()
	return len(e.active)
}

// Runners returns the languages this executor offers.
func (e *Executor) Runners() []runbox.Runner { return e.runners }

func languages(rs []runbox.Runner) []string {
	out := make([]string, len(rs))
	for i, r := range rs {
		out[i] = r.Language
	}
	return out
}
