package sandbox

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/runbox-dev/runbox"
	"github.com/runbox-dev/runbox/internal/agent"
)

// warmKey names the sandboxes a run may use: its conversation's, in its
// language.
type warmKey struct {
	conversation, language string
}

// fileID identifies a folder across renames: what a bind mount holds on to.
type fileID struct {
	dev, ino uint64
}

func dirID(path string) (fileID, error) {
	var st syscall.Stat_t
	if err := syscall.Stat(path, &st); err != nil {
		return fileID{}, err
	}
	return fileID{dev: uint64(st.Dev), ino: st.Ino}, nil
}

// sandbox is one started container and the agent in it.
type sandbox struct {
	m        *Manager
	id       string
	key      warmKey
	data     fileID // the folder mounted at /data
	attach   io.Closer
	conn     *agent.Conn
	agentErr *logWriter
	dataDir  string
	sockets  string // the folder of its proxy socket; "" for none
	idleFrom time.Time
	done     <-chan struct{} // closed when its attached streams end
	// running is the run it runs, while it does (streams.go).
	running atomic.Pointer[runTag]
	// keptGen is the generation of its kept interpreter (kept.go); 0 for
	// none known.
	keptGen int64
	// keeps says that a kept-state cell ran in it since it was started or
	// reset: an interpreter of its conversation may live in it.
	keeps bool
	// adopted says that a new conversation adopted it and has not run in
	// it yet: the run that asked for it is about to take it.
	adopted bool
}

// ended reports whether the sandbox's attached streams ended: it stopped,
// or its engine went away, and it is of no more use.
func (sb *sandbox) ended() bool {
	select {
	case <-sb.done:
		return true
	default:
		return false
	}
}

// take returns the conversation's idle sandbox, if it still mounts the
// conversation's folder as it is now (not one deleted and made anew, nor a
// disk image unmounted and mounted again).
func (m *Manager) take(key warmKey, dataDir string) *sandbox {
	m.mu.Lock()
	sb := m.warm[key]
	delete(m.warm, key)
	m.mu.Unlock()
	if sb == nil {
		return nil
	}
	if id, err := dirID(dataDir); err != nil || id != sb.data || sb.ended() {
		m.background(sb, m.discard)
		return nil
	}
	return sb
}

// park keeps a sandbox for its conversation's next run, making room if
// its language has too many.
func (m *Manager) park(sb *sandbox) {
	if sb.ended() {
		m.discard(sb)
		return
	}
	sb.idleFrom = time.Now()
	limit := m.opts.MaxWarm.For(sb.key.language)
	m.mu.Lock()
	if m.closed {
		m.mu.Unlock()
		m.discard(sb)
		return
	}
	prev := m.warm[sb.key]
	m.warm[sb.key] = sb
	if m.policy.pressed(sb.key.language, m.clock.Now()) {
		m.poolChangedLocked() // new conversations waiting may reclaim it
	}
	var evict []*sandbox
	var surplus *sandbox
	if prev != nil && prev != sb {
		// Another of the conversation's sandboxes (several runs went at
		// once): its folder stays the conversation's, so it is removed,
		// never recycled.
		surplus = prev
	}
	for {
		n, oldest := 0, sb
		for _, w := range m.warm {
			if w.key.language == sb.key.language {
				n++
				if w.idleFrom.Before(oldest.idleFrom) {
					oldest = w
				}
			}
		}
		if n <= limit {
			break
		}
		delete(m.warm, oldest.key)
		evict = append(evict, oldest)
	}
	m.mu.Unlock()
	if surplus != nil {
		m.background(surplus, m.discard)
	}
	for _, w := range evict {
		m.background(w, m.recycle)
	}
}

// background hands sb to end in a goroutine Close waits for; once the
// manager is closed, it removes sb at once instead.
func (m *Manager) background(sb *sandbox, end func(*sandbox)) {
	if !m.goBackground(func() { end(sb) }) {
		m.discard(sb)
	}
}

// goBackground runs f in a goroutine Close waits for, unless the manager
// is closed; it reports whether it did.
func (m *Manager) goBackground(f func()) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closed {
		return false
	}
	m.bg.Add(1)
	go func() {
		defer m.bg.Done()
		f()
	}()
	return true
}

// toPool puts sb in its language's pool, or removes it once the manager is
// closed.
func (m *Manager) toPool(lang string, sb *sandbox) error { return m.joinPool(lang, sb, false) }

// joinPool is toPool; recycled says that sb was counted among those coming
// by recycling, which it leaves in the same step (the policy's push): a
// sandbox is on its way or pooled, never both, as those who count what is
// on its way (nextPooled, the pool filler's Reclaim) assume.
func (m *Manager) joinPool(lang string, sb *sandbox, recycled bool) error {
	m.mu.Lock()
	m.poolChangedLocked()
	if m.closed {
		if recycled {
			m.policy.recycleDropped(lang)
		}
		m.mu.Unlock()
		m.discard(sb)
		return errClosed
	}
	m.policy.push(lang, sb, recycled)
	m.mu.Unlock()
	return nil
}

// poolChangedLocked wakes the conversations waiting for a pooled sandbox
// (Adopt): one joined a pool, or a start ended. The caller holds m.mu.
func (m *Manager) poolChangedLocked() {
	close(m.poolChanged)
	m.poolChanged = make(chan struct{})
}

// errClosed says that the manager was closed: it keeps no sandbox.
var errClosed = errors.New("the sandbox manager is closed")

// refill starts a new sandbox for a conversation whose sandbox was killed,
// in the background, so that its next run (a retry, most likely) does not
// wait for a container to start.
func (m *Manager) refill(runner runbox.Runner, req Request) {
	if m.opts.MaxWarm.For(req.Language) == 0 {
		return
	}
	m.goBackground(func() {
		ctx, cancel := context.WithTimeout(context.Background(), helloTimeout)
		defer cancel()
		sb, err := m.create(ctx, runner, req)
		if err != nil {
			m.log.Debug("refill sandbox", "conversation", req.ConversationID, "err", err)
			return
		}
		m.mu.Lock()
		taken := m.warm[sb.key] != nil
		m.mu.Unlock()
		if taken {
			m.discard(sb)
			return
		}
		m.park(sb)
	})
}

// WarmLimits bound the idle warm sandboxes per language.
type WarmLimits struct {
	Default     int            // for languages not listed
	PerLanguage map[string]int // by language
}

// For returns the bound of a language.
func (l WarmLimits) For(lang string) int {
	if n, ok := l.PerLanguage[lang]; ok {
		return n
	}
	return l.Default
}

// ParseWarmLimits reads SANDBOX_MAX_WARM: "16" bounds every language;
// "python=16,bash=4" bounds those two and keeps no warm sandbox of any
// other; "8,python=16" gives python 16 and the others 8.
func ParseWarmLimits(s string) (WarmLimits, error) {
	l := WarmLimits{PerLanguage: map[string]int{}}
	for part := range strings.SplitSeq(s, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		lang, num, per := strings.Cut(part, "=")
		if !per {
			num = lang
		}
		n, err := strconv.Atoi(strings.TrimSpace(num))
		if err != nil || n < 0 {
			return l, fmt.Errorf("%q is not a count of sandboxes", part)
		}
		if per {
			l.PerLanguage[strings.TrimSpace(lang)] = n
		} else {
			l.Default = n
		}
	}
	return l, nil
}

// discard removes a sandbox for good.
func (m *Manager) discard(sb *sandbox) {
	m.mu.Lock()
	delete(m.open, sb)
	m.mu.Unlock()
	// The attach stream first: a stream's write blocked on it then fails,
	// and closing the streams never waits for it.
	sb.attach.Close()
	sb.conn.Close()
	m.remove(sb.id)
	if sb.sockets != "" {
		_ = os.RemoveAll(sb.sockets)
	}
}

// Prune recycles or removes the warm sandboxes idle for longer than the
// TTL.
func (m *Manager) Prune() int {
	return m.evict(func(sb *sandbox) bool { return time.Since(sb.idleFrom) > m.opts.IdleTTL }, m.recycle)
}

// Drop removes a conversation's warm sandboxes: it was closed.
func (m *Manager) Drop(conversation string) int {
	return m.drop(func(sb *sandbox) bool { return sb.key.conversation == conversation })
}

// Close removes every warm and every pre-started sandbox, and waits for
// the background work on sandboxes to end; from then on a sandbox whose
// run ends is removed, not kept.
func (m *Manager) Close() int {
	m.mu.Lock()
	m.closed = true
	m.poolChangedLocked() // no conversation waits for the pool any more
	gone := m.policy.drain()
	for k, sb := range m.warm {
		gone = append(gone, sb)
		delete(m.warm, k)
	}
	m.mu.Unlock()
	// An executor that stops saves its conversations' kept state first.
	each(gone, func(sb *sandbox) {
		_, _ = m.pauseKept(sb)
		m.discard(sb)
	})
	m.bg.Wait()
	return len(gone)
}

// Prestart starts a sandbox for a conversation not known yet, mounting
// dataDir (a slot), and keeps it in its language's pool until Adopt gives
// it to a new conversation. Several may start at once; new conversations
// that find the pool empty meanwhile wait for them (Adopt). It makes no
// room for its sandbox: when the engine has none, or a run is making
// some, it fails with engine.ErrNoRoom.
func (m *Manager) Prestart(ctx context.Context, language, dataDir string) error {
	m.mu.Lock()
	runner, ok := m.runners[language]
	wanted := m.roomWanted > 0
	if ok && !wanted {
		m.policy.startBegan(language)
		m.poolChangedLocked() // a new conversation waiting may wait for it
	}
	m.mu.Unlock()
	if !ok {
		return fmt.Errorf("%w %q", ErrUnknownLanguage, language)
	}
	if wanted {
		return errRoomWanted
	}
	begin := m.clock.Now()
	sb, err := m.create(ctx, runner, Request{RunID: "pool", Language: language, DataDir: dataDir})
	if err == nil {
		m.demand.started(language, m.clock.Since(begin))
		err = m.toPool(language, sb)
	}
	m.mu.Lock()
	m.policy.startEnded(language)
	m.poolChangedLocked()
	m.mu.Unlock()
	return err
}

// Pooled returns how many pre-started sandboxes of a language wait.
func (m *Manager) Pooled(language string) int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.policy.pooled(language)
}

// PoolWants is signalled when a new conversation asks for a pooled
// sandbox, taken or not: the pool may want another (PoolTarget).
func (m *Manager) PoolWants() <-chan struct{} { return m.wants }

// adoptWait bounds how long a new conversation waits for a pooled
// sandbox that is starting, rather than starting its own: the one under
// way began earlier, and another start at once would only slow both.
const adoptWait = 10 * time.Second

// adoptGrace bounds how long a new conversation that finds nothing on its
// way to the pool waits for something before it starts a sandbox of its
// own: a run about to end parks a sandbox it may reclaim, or the pool
// filler, woken by the same ask, begins a start. Either comes sooner than
// a start of its own would end.
const adoptGrace = 200 * time.Millisecond

// Adopt gives a new conversation a pre-started sandbox of its language:
// one that waits in the pool, or, when the pool is empty, one on its way
// there and not promised to another conversation already waiting — a
// recycle or a start (at most adoptWait), or what comes within
// adoptGrace — until ctx ends. adopt turns the sandbox's slot into the
// conversation's folder and returns that folder; when it fails the
// sandbox goes back to the pool, unless the error is ErrSpoiled. Adopt
// reports whether the conversation got one.
func (m *Manager) Adopt(ctx context.Context, conversation, language string, adopt func(slot string) (string, error)) bool {
	m.demand.took(language) // taken or not: the pool's size follows the asking
	select {
	case m.wants <- struct{}{}:
	default:
	}
	w := poolWait{m: m, language: language}
	defer w.stop()
	for first := true; ; first = false {
		sb, wait, counted := m.nextPooled(language, first)
		if sb == nil {
			if wait == nil || !w.wait(ctx, wait, counted) {
				m.gaveUp(ctx, language)
				return false
			}
			continue
		}
		if sb.ended() {
			m.discard(sb)
			continue
		}
		dir, err := adopt(sb.dataDir)
		if errors.Is(err, ErrSpoiled) {
			m.log.Warn("removing a pooled sandbox whose folder could not be restored", "container", shortID(sb.id), "err", err)
			m.discard(sb)
			return false
		}
		if err != nil {
			m.log.Debug("a pooled sandbox's folder could not be adopted", "container", shortID(sb.id), "err", err)
			_ = m.toPool(language, sb) // closed meanwhile: removed
			return false
		}
		m.mu.Lock()
		sb.key, sb.dataDir, sb.adopted = warmKey{conversation: conversation, language: language}, dir, true
		m.mu.Unlock()
		m.park(sb)
		return true
	}
}

// gaveUp records that a new conversation of language waited for a pooled
// sandbox in vain and starts one of its own: recycling does not keep up,
// and the pool filler may start sandboxes again (StartsHeld).
func (m *Manager) gaveUp(ctx context.Context, language string) {
	if ctx.Err() != nil {
		return
	}
	m.mu.Lock()
	m.policy.gaveUp(language, m.clock.Now())
	m.mu.Unlock()
}

// poolWait is a new conversation's wait for a pooled sandbox: adoptWait
// from its first wait for a sandbox on its way, adoptGrace from the first
// of a run of waits with nothing on its way.
type poolWait struct {
	m               *Manager
	language        string
	deadline, grace clockwork.Timer // adoptWait, adoptGrace
}

// wait waits for the pool to change; counted says that the conversation
// waits for a sandbox on its way (nextPooled counted it among those
// waiting), within adoptWait, else for anything to come, within
// adoptGrace. It reports whether to look at the pool again.
func (w *poolWait) wait(ctx context.Context, changed <-chan struct{}, counted bool) bool {
	var limit <-chan time.Time
	if counted {
		defer func() {
			w.m.mu.Lock()
			w.m.policy.waited(w.language)
			w.m.mu.Unlock()
		}()
		if w.deadline == nil {
			w.deadline = w.m.clock.NewTimer(adoptWait)
		}
		if w.grace != nil { // something came: a later grace is a new one
			w.grace.Stop()
			w.grace = nil
		}
		limit = w.deadline.Chan()
	} else {
		if w.grace == nil {
			w.grace = w.m.clock.NewTimer(adoptGrace)
		}
		limit = w.grace.Chan()
	}
	select {
	case <-changed:
		return true
	case <-ctx.Done():
	case <-limit:
	}
	return false
}

func (w *poolWait) stop() {
	for _, t := range []clockwork.Timer{w.deadline, w.grace} {
		if t != nil {
			t.Stop()
		}
	}
}

// nextPooled takes the pooled sandbox of language that waited longest (a
// sandbox recycled a moment ago may still be starting its zygote). When
// there is none, it returns what to wait on instead: with counted, a
// sandbox on its way not promised to a conversation waiting already — a
// recycle under way, one it reclaims for the caller (reclaim.go), as a
// reset is quicker than a start, or a start under way — for which it
// counts the caller among those waiting; without, the pool's next change,
// as nothing is on its way. Neither once the manager is closed. arrived
// says that this is the caller's first look: a new conversation that finds
// the pool empty on arrival presses it (pressedLocked); its later looks,
// after a change that served another, do not. (The policy's look and
// wait decide; policy.go.)
func (m *Manager) nextPooled(language string, arrived bool) (sb *sandbox, changed <-chan struct{}, counted bool) {
	m.mu.Lock()
	if sb, ok := m.policy.pop(language); ok {
		m.mu.Unlock()
		return sb, nil, false
	}
	if m.closed {
		m.mu.Unlock()
		return nil, nil, false
	}
	var reclaimed *sandbox
	if m.policy.look(language, m.clock.Now(), arrived) {
		reclaimed = m.reclaimLocked(language)
	}
	changed = m.poolChanged
	counted = m.policy.wait(language)
	m.mu.Unlock()
	if reclaimed != nil {
		m.startReclaimed(reclaimed)
	}
	return nil, changed, counted
}

// drop removes the warm sandboxes match selects, several at once.
func (m *Manager) drop(match func(*sandbox) bool) int {
	gone := m.unwarm(match)
	each(gone, m.discard)
	return len(gone)
}

// evict takes the warm sandboxes match selects out of use and hands each
// to end, one after another (a recycle checks the pool's room first).
func (m *Manager) evict(match func(*sandbox) bool, end func(*sandbox)) int {
	gone := m.unwarm(match)
	for _, sb := range gone {
		end(sb)
	}
	return len(gone)
}

// unwarm takes the warm sandboxes match selects out of use.
func (m *Manager) unwarm(match func(*sandbox) bool) []*sandbox {
	m.mu.Lock()
	defer m.mu.Unlock()
	var gone []*sandbox
	for k, sb := range m.warm {
		if match(sb) {
			gone = append(gone, sb)
			delete(m.warm, k)
		}
	}
	return gone
}

// removals bounds the sandboxes ended at once: the engine takes seconds
// to remove a gVisor sandbox, mostly waiting, and one after another
// a few dozen took longer than a stopping executor is given.
const removals = 8

// each calls end on every item, up to removals at once, and returns when
// all have returned.
func each[T any](items []T, end func(T)) {
	var wg sync.WaitGroup
	sem := make(chan struct{}, removals)
	for _, it := range items {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			end(it)
		})
	}
	wg.Wait()
}

// HasSandbox reports whether a conversation has a sandbox here: an idle
// one, of any language, or a run under way (Hold). Each mounts the
// conversation's folder as it is, which must then keep its identity: it
// is not moved into a pooled sandbox's.
func (m *Manager) HasSandbox(conversation string) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.hasSandboxLocked(conversation)
}

func (m *Manager) hasSandboxLocked(conversation string) bool {
	if m.held[conversation] > 0 {
		return true
	}
	for k := range m.warm {
		if k.conversation == conversation {
			return true
		}
	}
	return false
}

// Hold marks a conversation as having a run under way here until release
// is called: from before its sandbox is taken or started to after the
// run, so that no idle sandbox of the conversation is recycled — which
// would take the folder the run's sandbox mounts away from it — and its
// folder is not moved into a pooled sandbox (HasSandbox). Several runs of
// one conversation may hold it at once.
func (m *Manager) Hold(conversation string) (release func()) {
	m.mu.Lock()
	m.held[conversation]++
	m.mu.Unlock()
	var once sync.Once
	return func() {
		once.Do(func() {
			m.mu.Lock()
			if m.held[conversation]--; m.held[conversation] <= 0 {
				delete(m.held, conversation)
			}
			m.mu.Unlock()
		})
	}
}

// PoolTarget returns how many pre-started sandboxes of a language the
// pool should hold: as demand says (demand.go), at least configured and
// at most the ceiling of MaxPool, MaxWarm and PoolMemory.
func (m *Manager) PoolTarget(language string, configured int) int {
	ceiling := poolCeiling(m.opts.MaxPool.For(language), m.opts.MaxWarm.For(language), m.opts.PoolMemory,
		m.opts.Limits.Memory)
	return m.demand.target(language, configured, ceiling, m.pressedNow(language))
}

// Landlock reports whether programs in these sandboxes can be held to
// filesystem rules (agent.Rules): the runtime's kernel offers Landlock.
func (m *Manager) Landlock() bool {
	return m.engine.Landlock()
}

// Conversations returns how many conversations have a sandbox here: an
// idle one, or a run under way.
func (m *Manager) Conversations() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	convs := make(map[string]struct{}, len(m.held)+len(m.warm))
	for c := range m.held {
		convs[c] = struct{}{}
	}
	for k := range m.warm {
		convs[k.conversation] = struct{}{}
	}
	return len(convs)
}

// Warm returns how many sandboxes wait for their conversations.
func (m *Manager) Warm() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.warm)
}

// String describes a sandbox for logs.
func (sb *sandbox) String() string {
	return fmt.Sprintf("%s (%s, %s)", shortID(sb.id), sb.key.conversation, sb.key.language)
}
