// Package sandbox runs programs in locked-down sandboxes of an Engine:
// package docker's (containers on the executor's host, under runc or
// gVisor) or package kubernetes's (pods of a cluster).
//
// A sandbox runs the runner agent (package agent) as its first process;
// the Manager talks to it over that process's attached stdin and stdout,
// so a run costs no engine API call once its sandbox is up. A sandbox is
// started for a conversation and language, mounts that conversation's
// folder at /data, and stays with it while it is used: later runs of the
// conversation reuse it (warm.go). It is never shared with another
// conversation, and it is removed when it idles past its TTL, when a run
// is killed (timeout, cancel), or when anything about it is in doubt.
// Sandboxes for new conversations wait started in a pool, whose policy
// (how many, when to start, when to reclaim an idle one) is apart from
// their lifecycle (policy.go).
package sandbox

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"os"
	"path"
	"regexp"
	"slices"
	"strconv"
	"sync"
	"time"

	"github.com/jonboulle/clockwork"
	"golang.org/x/time/rate"

	"github.com/runbox-dev/runbox"
	"github.com/runbox-dev/runbox/internal/agent"
	"github.com/runbox-dev/runbox/internal/sandbox/engine"
)

// Labels of runner images (the contract's) and of the containers the
// executor starts (ours).
const (
	LabelRunner   = "sandbox.runner"
	LabelLanguage = "sandbox.language"
	LabelVersion  = "sandbox.version"
	// LabelTemplate marks a project template's image (its name), and
	// LabelTemplatePort the port its dev server listens on.
	LabelTemplate     = "sandbox.template"
	LabelTemplatePort = "sandbox.template.port"
	// LabelExecTmpfs asks for a tmpfs programs may execute files from,
	// of the size given (e.g. 64m), at ExecDir: compiled languages run
	// their programs from there (/tmp is noexec).
	LabelExecTmpfs = "runbox.exec-tmpfs"

	LabelManaged      = "runbox.managed"
	LabelExecutor     = "runbox.executor"
	LabelDeployment   = "runbox.deployment"
	LabelRun          = "runbox.run"
	LabelConversation = "runbox.conversation"
)

// User is the uid:gid programs run as. Conversation folders are made
// writable for it.
const User = "1000:1000"

// UID and GID of User.
const (
	UID = 1000
	GID = 1000
)

const (
	helloTimeout  = 30 * time.Second // container start and agent boot
	removeTimeout = 30 * time.Second
	tmpfsSize     = "64m"
	// ExecDir is where the exec tmpfs of LabelExecTmpfs is mounted.
	ExecDir = "/run/runbox"
)

// Engine creates, watches and removes the sandboxes of a Manager: package
// docker's runs them as Docker containers. Every sandbox it creates is
// locked down as engine.Spec says; an error of one of its methods is the
// engine's, not a program's. A sandbox already stopped or gone is no
// error to Kill or Remove.
type Engine interface {
	// Ping checks that the engine answers.
	Ping(ctx context.Context) error
	// Images returns the images that carry label (key=value).
	Images(ctx context.Context, label string) ([]engine.Image, error)
	// Check checks, once at start, that a sandbox of spec's image, user
	// and labels starts and exits under the engine's runtime.
	Check(ctx context.Context, spec engine.Spec) error
	// Create creates and starts a sandbox with its first process's
	// standard streams attached; its standard error goes to stderr. A
	// failure leaves no sandbox behind; one for want of room wraps
	// engine.ErrNoRoom (room.go).
	Create(ctx context.Context, spec engine.Spec, stderr io.Writer) (engine.Attached, error)
	Kill(ctx context.Context, id string) error
	Remove(ctx context.Context, id string) error
	// List returns the sandboxes, running or not, that carry every label.
	List(ctx context.Context, labels map[string]string) ([]engine.Sandbox, error)
	// Wait waits until a sandbox is not running, or ctx ends.
	Wait(ctx context.Context, id string) error
	// Inspect returns what the engine knows of a sandbox's end.
	Inspect(ctx context.Context, id string) (engine.State, error)
	// Landlock reports whether the kernel programs run on offers the
	// Landlock that filesystem rules (agent.Rules) need.
	Landlock() bool
}

// Limits bound every sandbox.
type Limits struct {
	Memory   int64 // bytes; swap is not allowed on top
	NanoCPUs int64
	Pids     int64
	// FileSize bounds any one file a program writes (RLIMIT_FSIZE); 0 is
	// no bound.
	FileSize int64
}

// Options configure a Manager.
type Options struct {
	ExecutorID string // labels the containers, so that a restart can reap them
	// Deployment labels the containers too, so that a live executor can
	// reap those of a dead one of the same deployment (see ReapDead).
	Deployment string
	Limits     Limits
	Logger     *slog.Logger
	// IdleTTL is how long a warm sandbox waits for its conversation's next
	// run before it is removed.
	IdleTTL time.Duration
	// MaxWarm bounds the idle warm sandboxes kept per language; the least
	// recently used go first. A language bounded to 0 gets a fresh sandbox
	// for every run.
	MaxWarm WarmLimits
	// ImageTag is the tag of the runner images to prefer
	// (runner-<language>:<ImageTag>); DefaultImageTag if empty.
	ImageTag string
	// Recycle, if set, takes the folder an evicted sandbox mounts away
	// from its conversation and returns it as an empty slot (see
	// recycle.go); mounted says whether a folder is the sandbox's.
	Recycle func(conversation string, mounted func(dir string) bool, idleSince time.Time) (slot string, err error)
	// MaxPool bounds the pool of pre-started and recycled sandboxes, per
	// language.
	MaxPool WarmLimits
	// PoolMemory, if set, bounds the pools further: no more sandboxes
	// than fit in it at Limits.Memory each (app gives half the memory the
	// host had available at start).
	PoolMemory int64
	// Clock times the pool's demand and waits (a fake one in tests).
	Clock clockwork.Clock
	// Inbound, if set, receives the connections programs make to their
	// sandbox's proxy listener while it runs a run (streams.go); it owns
	// each, and must not block for long. Without it they are closed.
	Inbound func(Inbound)
	// Sockets, if set, is a folder of the Docker host, this executor's
	// alone, where each sandbox gets a folder with its proxy socket
	// (agent.ListenProxy), mounted at agent.ProxySocket's: the fast way
	// for Inbound's connections. Without it they come as streams.
	Sockets string
	// State, if set, saves a kept interpreter's state as its sandbox goes
	// and restores it in the conversation's next (kept.go).
	State StateKeeper
}

// DefaultImageTag is the tag `make images` gives runner images.
const DefaultImageTag = "latest"

// DefaultIdleTTL is the IdleTTL of Options that set none.
const DefaultIdleTTL = 30 * time.Minute

// Manager runs programs in sandboxes.
type Manager struct {
	engine Engine
	opts   Options
	log    *slog.Logger

	mu        sync.Mutex
	runners   map[string]runbox.Runner // by language, and templates by TemplateKey
	templates []runbox.Template
	live      map[string]struct{}   // containers started and not yet removed
	open      map[*sandbox]struct{} // sandboxes started and not yet discarded, in use or not
	warm      map[warmKey]*sandbox  // idle sandboxes, ready for their conversation
	held      map[string]int        // conversations with runs under way here (Hold), and how many
	// execTmpfs is the size of the exec tmpfs each language's image asks
	// for (LabelExecTmpfs), by language; none if absent.
	execTmpfs map[string]string
	// policy holds the pre-started sandboxes for new conversations, by
	// language, and decides for their pool (policy.go); demand, how many
	// it should hold.
	policy *poolPolicy[*sandbox]
	demand *demand
	// poolChanged is closed, and replaced, when a sandbox joins a pool or
	// a start ends.
	poolChanged chan struct{}
	wants       chan struct{} // a new conversation asked (PoolWants)
	clock       clockwork.Clock
	// roomWanted counts the runs making room for their sandbox
	// (createRoom): the pool starts none meanwhile.
	roomWanted int
	// closed is set by Close: from then on no sandbox is kept (warm or
	// pooled) and no background work starts.
	closed bool
	// bg counts the background work on sandboxes (recycles, removals,
	// refills) that Close waits for; added to under mu while not closed.
	bg sync.WaitGroup
}

// NewManager returns a Manager of eng's sandboxes.
func NewManager(eng Engine, opts Options) *Manager {
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	opts.IdleTTL = cmp.Or(opts.IdleTTL, DefaultIdleTTL)
	clock := opts.Clock
	if clock == nil {
		clock = clockwork.NewRealClock()
	}
	opts.ImageTag = cmp.Or(opts.ImageTag, DefaultImageTag)
	// <Sockets>/<socketName>/proxy.sock
	if n := len(opts.Sockets) + 2 + socketName + len(path.Base(agent.ProxySocket)); opts.Sockets != "" && n > agent.MaxSocketPath {
		log.Info("the sandbox folder's path is too long for proxy sockets: egress goes the slower way",
			"bytes", n, "max", agent.MaxSocketPath)
		opts.Sockets = ""
	}
	return &Manager{
		engine: eng, opts: opts, log: log,
		runners: map[string]runbox.Runner{}, live: map[string]struct{}{}, open: map[*sandbox]struct{}{}, warm: map[warmKey]*sandbox{},
		held:   map[string]int{},
		policy: newPoolPolicy[*sandbox](opts.Recycle != nil), demand: newDemand(clock),
		poolChanged: make(chan struct{}),
		wants:       make(chan struct{}, 1), clock: clock,
	}
}

// Ping checks that the engine answers.
func (m *Manager) Ping(ctx context.Context) error {
	return m.engine.Ping(ctx)
}

// Discover finds the runner images by their labels and returns their
// languages. Where several images offer a language, the one tagged
// runner-<language>:<ImageTag> wins.
func (m *Manager) Discover(ctx context.Context) ([]runbox.Runner, error) {
	images, err := m.engine.Images(ctx, LabelRunner+"=true")
	if err != nil {
		return nil, fmt.Errorf("list runner images: %w", err)
	}
	found, templates, execTmpfs := map[string]runbox.Runner{}, map[string]runbox.Template{}, map[string]string{}
	for _, img := range images {
		if len(img.Tags) == 0 {
			continue
		}
		if name := img.Labels[LabelTemplate]; validTemplateName(name) {
			port, err := strconv.Atoi(img.Labels[LabelTemplatePort])
			if err != nil || port < 1 || port > 65535 {
				m.log.Warn("a template image without a valid port label is left out", "template", name, "label", LabelTemplatePort)
				continue
			}
			preferred := "runner-template-" + name + ":" + m.opts.ImageTag
			if prev, ok := templates[name]; !ok || prev.Image != preferred {
				templates[name] = runbox.Template{Name: name, Image: preferredTag(img.Tags, preferred), Port: port}
			}
			continue
		}
		lang := img.Labels[LabelLanguage]
		if lang == "" {
			continue
		}
		preferred := "runner-" + lang + ":" + m.opts.ImageTag
		tag := preferredTag(img.Tags, preferred)
		if prev, ok := found[lang]; ok && prev.Image == preferred {
			continue
		}
		found[lang] = runbox.Runner{Language: lang, Image: tag, Version: img.Labels[LabelVersion]}
		delete(execTmpfs, lang)
		if size := img.Labels[LabelExecTmpfs]; size != "" {
			if !tmpfsSizePattern.MatchString(size) {
				m.log.Warn("ignoring a runner image's exec tmpfs size", "image", tag, "size", size)
				continue
			}
			execTmpfs[lang] = size
		}
	}
	out := slices.Collect(maps.Values(found))
	slices.SortFunc(out, func(a, b runbox.Runner) int { return cmp.Compare(a.Language, b.Language) })
	tpls := slices.Collect(maps.Values(templates))
	slices.SortFunc(tpls, func(a, b runbox.Template) int { return cmp.Compare(a.Name, b.Name) })
	for _, t := range tpls {
		found[TemplateKey(t.Name)] = runbox.Runner{Language: TemplateKey(t.Name), Image: t.Image}
	}
	m.mu.Lock()
	m.runners, m.templates, m.execTmpfs = found, tpls, execTmpfs
	m.mu.Unlock()
	return out, nil
}

// preferredTag returns preferred if tags hold it, else the first.
func preferredTag(tags []string, preferred string) string {
	if slices.Contains(tags, preferred) {
		return preferred
	}
	return tags[0]
}

// Templates returns the project templates the images offer (after
// Discover), sorted by name.
func (m *Manager) Templates() []runbox.Template {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Clone(m.templates)
}

// TemplateKey is the Request.Language of a run in a template's sandbox
// (runbox.TemplateLanguage): its warm sandboxes are its own.
func TemplateKey(name string) string { return runbox.TemplateLanguage(name) }

// validTemplateName: what a template may be called (it names images and
// containers).
func validTemplateName(name string) bool {
	if name == "" || len(name) > 32 {
		return false
	}
	for _, r := range name {
		if !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '-') {
			return false
		}
	}
	return true
}

// tmpfsSizePattern is what LabelExecTmpfs may say: a size as tmpfs takes it.
var tmpfsSizePattern = regexp.MustCompile(`^[1-9][0-9]{0,5}[kmg]$`)

// Request is a program to run.
type Request struct {
	RunID          string
	ConversationID string
	Language       string
	Code           string
	Env            map[string]string
	// Trust, when set, is a PEM certificate the program's TLS clients
	// trust besides the image's roots (agent.Run.Trust).
	Trust string
	// Stdin is the program's input; nil means none. The program sees EOF
	// when Stdin does.
	Stdin   io.Reader
	Timeout time.Duration
	// DataDir is the host folder mounted at /data.
	DataDir string
	// KeepState runs Python code in the sandbox's kept interpreter.
	KeepState bool
	// Filesystem, when set, narrows what the program may read and write.
	Filesystem *agent.Rules
	// OnStart, if set, is called once the program has been handed to the
	// sandbox's agent: it runs from then on.
	OnStart func()
}

// Stream names an output stream.
type Stream int

const (
	Stdout Stream = iota + 1
	Stderr
)

// Output receives a program's output as it is produced, from one goroutine
// at a time.
type Output func(s Stream, p []byte)

// Outcome is how a program ended.
type Outcome struct {
	ExitCode  int // -1 when a signal ended it
	TimedOut  bool
	OOMKilled bool
	// Cancelled is set when ctx ended the run; context.Cause(ctx) says why.
	Cancelled bool
	Duration  time.Duration
	// Kernel is, for a kept-state run, agent.KernelNew when its
	// interpreter was started for it, agent.KernelKept when it had run
	// earlier cells.
	Kernel string
	// StateLost is set when the kept interpreter died with the run.
	StateLost bool
	// StateRestored is set when the run's kept interpreter was restored
	// from a pause before it ran; LostVariables are those it could not
	// bring back.
	StateRestored bool
	LostVariables []string
	// Phase is, for a compiled language, the phase that ended the run:
	// agent.PhaseCompile or agent.PhaseRun; empty when unknown.
	Phase string
	// Quota is, when the sandbox's agent measures its folder (an
	// engine's that copies it out: Kubernetes), the bound of the
	// conversation's quota the run's files passed: agent.QuotaBytes or
	// agent.QuotaEntries. The agent stopped the program there, the
	// engine took none of its files, and the sandbox is removed.
	Quota string
	// unclean is set when the agent could not show that nothing of the
	// program is left; the sandbox is then removed, never reused.
	unclean bool
	// interrupted is set when a timed-out or cancelled cell was
	// interrupted and ended in time: its sandbox and state live on.
	interrupted bool
}

// ErrUnknownLanguage reports a language no runner image offers.
var ErrUnknownLanguage = errors.New("sandbox: no runner for language")

// Run runs req in its conversation's warm sandbox, or in a new one. Once
// the program ends, a sandbox that is sound stays warm for the next run; one
// that was killed or misbehaved is removed. Cancelling ctx kills the
// program. An error means the service failed, not the program.
func (m *Manager) Run(ctx context.Context, req Request, out Output) (Outcome, error) {
	m.mu.Lock()
	runner, ok := m.runners[req.Language]
	m.mu.Unlock()
	if !ok {
		return Outcome{}, fmt.Errorf("%w %q", ErrUnknownLanguage, req.Language)
	}
	key := warmKey{conversation: req.ConversationID, language: req.Language}
	sb := m.take(key, req.DataDir)
	if sb == nil {
		var err error
		if sb, err = m.createRoom(ctx, runner, req); err != nil {
			return Outcome{}, err
		}
	}
	var kept Outcome
	sb.keeps, sb.adopted = sb.keeps || req.KeepState, false
	m.resumeKept(ctx, sb, req, &kept)
	oc, err := sb.run(ctx, req, out)
	oc.StateRestored, oc.LostVariables = kept.StateRestored, kept.LostVariables
	sb.keptAfter(req, oc)
	switch {
	case err != nil:
		m.discard(sb)
	case oc.Quota != "":
		// Its folder holds what the conversation's does not.
		m.log.Info("a program's files passed their quota; removing its sandbox", "container", shortID(sb.id), "bound", oc.Quota)
		m.discard(sb)
		m.refill(runner, req)
	case oc.unclean:
		m.log.Warn("a program left processes the agent could not end; removing its sandbox", "container", shortID(sb.id))
		m.discard(sb)
		m.refill(runner, req)
	case oc.interrupted:
		m.park(sb)
	case oc.TimedOut || oc.Cancelled:
		m.discard(sb)
		if oc.TimedOut {
			m.refill(runner, req)
		}
	default:
		m.park(sb)
	}
	return oc, err
}

// Reap removes this executor's containers that it does not track and that
// are older than minAge: orphans of an earlier process, or of a failure to
// remove. It returns how many it removed.
func (m *Manager) Reap(ctx context.Context, minAge time.Duration) (int, error) {
	items, err := m.engine.List(ctx, m.ownLabels())
	if err != nil {
		return 0, err
	}
	n := 0
	for _, c := range items {
		m.mu.Lock()
		_, tracked := m.live[c.ID]
		m.mu.Unlock()
		if tracked || time.Since(c.Created) < minAge {
			continue
		}
		m.forceRemove(c.ID)
		n++
	}
	return n, nil
}

// ReapDead removes the containers of this deployment's other executors
// that alive does not vouch for and that are older than minAge: the
// sandboxes of an executor that crashed and will not come back (a
// scaled-down replica, a killed container) would otherwise live on.
// Containers of other deployments are never touched. It returns how many
// it removed of each executor.
func (m *Manager) ReapDead(ctx context.Context, alive func(executor string) bool, minAge time.Duration) (map[string]int, error) {
	items, err := m.peerContainers(ctx)
	if err != nil {
		return nil, err
	}
	removed := map[string]int{}
	for _, c := range items {
		owner := c.Labels[LabelExecutor]
		if alive(owner) || time.Since(c.Created) < minAge {
			continue
		}
		m.forceRemove(c.ID)
		removed[owner]++
	}
	return removed, nil
}

// Peers returns the other executors of this deployment that have
// containers on this Docker host.
func (m *Manager) Peers(ctx context.Context) ([]string, error) {
	items, err := m.peerContainers(ctx)
	if err != nil {
		return nil, err
	}
	var peers []string
	for _, c := range items {
		if owner := c.Labels[LabelExecutor]; !slices.Contains(peers, owner) {
			peers = append(peers, owner)
		}
	}
	return peers, nil
}

// peerContainers lists the containers of this deployment's other
// executors on this Docker host.
func (m *Manager) peerContainers(ctx context.Context) ([]engine.Sandbox, error) {
	if m.opts.Deployment == "" {
		return nil, nil
	}
	items, err := m.engine.List(ctx, map[string]string{LabelManaged: "true", LabelDeployment: m.opts.Deployment})
	if err != nil {
		return nil, err
	}
	return slices.DeleteFunc(items, func(c engine.Sandbox) bool {
		return c.Labels[LabelExecutor] == m.opts.ExecutorID || c.Labels[LabelDeployment] != m.opts.Deployment
	}), nil
}

// Shutdown removes the warm sandboxes and then every container of this
// executor, tracked or not, and looks again until none is left or ctx
// ends: the engine may take longer than a removal's own timeout to
// remove a container (a gVisor sandbox with many tasks took over 30 s on
// a loaded machine), and one it is still removing is listed until it is
// gone. Call it once no run is left.
func (m *Manager) Shutdown(ctx context.Context) error {
	m.Close()
	defer m.removeSockets()
	for {
		items, err := m.engine.List(ctx, m.ownLabels())
		if err != nil {
			return err
		}
		if len(items) == 0 {
			return nil
		}
		each(items, func(c engine.Sandbox) { m.remove(c.ID) })
		select {
		case <-ctx.Done():
			return fmt.Errorf("%d containers are left: %w", len(items), ctx.Err())
		case <-time.After(shutdownRecheck):
		}
	}
}

// removeSockets removes the sockets' folder and what an earlier process
// left there.
func (m *Manager) removeSockets() {
	if m.opts.Sockets == "" {
		return
	}
	if err := os.RemoveAll(m.opts.Sockets); err != nil {
		m.log.Warn("remove proxy sockets", "err", err)
	}
}

// ownLabels select this executor's sandboxes.
func (m *Manager) ownLabels() map[string]string {
	return map[string]string{LabelExecutor: m.opts.ExecutorID}
}

// shutdownRecheck is how often Shutdown looks again for containers left.
const shutdownRecheck = 500 * time.Millisecond

// Live returns how many containers the manager has started and not yet
// removed.
func (m *Manager) Live() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.live)
}

func shortID(id string) string {
	if len(id) > 12 {
		return id[:12]
	}
	return id
}

// Agent stderr is logged at most this often (a burst of agentLogBurst),
// each entry cut to agentLogBytes: what a sandbox writes there must not
// flood the executor's log.
const (
	agentLogRate  = rate.Limit(1)
	agentLogBurst = 10
	agentLogBytes = 1024
)

// logWriter logs what the agent writes to stderr, at a bounded rate, and
// keeps the last of it for error messages.
type logWriter struct {
	log     *slog.Logger
	limit   *rate.Limiter
	mu      sync.Mutex
	tail    []byte
	dropped int // writes not logged since the last one that was
}

func newLogWriter(log *slog.Logger) *logWriter {
	return &logWriter{log: log, limit: rate.NewLimiter(agentLogRate, agentLogBurst)}
}

// named adds the sandbox's name to what is logged from now on: it is
// known once the sandbox exists, and its agent may write before.
func (w *logWriter) named(container string) {
	w.mu.Lock()
	w.log = w.log.With("container", container)
	w.mu.Unlock()
}

func (w *logWriter) Write(p []byte) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.tail = append(w.tail, p...)
	if len(w.tail) > 512 {
		w.tail = w.tail[len(w.tail)-512:]
	}
	if !w.limit.Allow() {
		w.dropped++
		return len(p), nil
	}
	msg := p[:min(len(p), agentLogBytes)]
	if w.dropped > 0 {
		w.log.Warn("sandbox agent", "stderr", string(msg), "dropped_before", w.dropped)
	} else {
		w.log.Warn("sandbox agent", "stderr", string(msg))
	}
	w.dropped = 0
	return len(p), nil
}

func (w *logWriter) String() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return string(w.tail)
}
