package sandbox

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/runbox-dev/runbox/internal/agent"
	"github.com/runbox-dev/runbox/internal/sandbox/engine"
	"github.com/runbox-dev/runbox/internal/snapshot"
)

// roomEngine is an engine of bounded room, as a Kubernetes node is: it
// has room for room more sandboxes, refuses any beyond with ErrNoRoom,
// and gets room back as one is removed — unless taken is set (room taken
// by something else, which no removal frees). Each sandbox's agent is
// agent.Serve running bash in the test's process.
type roomEngine struct {
	t       *testing.T
	mu      sync.Mutex
	room    int
	taken   bool
	boxes   map[string]*fakeBox
	created int
	refused int
	quota   agent.Quota // its agents'
}

type fakeBox struct {
	cancel context.CancelFunc
	in     *io.PipeWriter // the executor's end of its stdin
	out    *io.PipeReader // the executor's end of its stdout
	done   chan struct{}
}

func (b *fakeBox) Close() error {
	b.in.Close()
	b.out.Close()
	return nil
}

// stop ends the box's agent and waits for it.
func (b *fakeBox) stop() {
	b.cancel()
	b.Close()
	<-b.done
}

func newRoomEngine(t *testing.T) *roomEngine {
	return &roomEngine{t: t, boxes: map[string]*fakeBox{}}
}

func (e *roomEngine) setRoom(n int, taken bool) {
	e.mu.Lock()
	e.room, e.taken = n, taken
	e.mu.Unlock()
}

func (e *roomEngine) counts() (live, created, refused int) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return len(e.boxes), e.created, e.refused
}

func (e *roomEngine) Ping(context.Context) error { return nil }

func (e *roomEngine) Images(context.Context, string) ([]engine.Image, error) {
	var out []engine.Image
	for _, lang := range []string{"python", "bash"} {
		out = append(out, engine.Image{Tags: []string{"runner-" + lang + ":latest"},
			Labels: map[string]string{LabelRunner: "true", LabelLanguage: lang}})
	}
	return out, nil
}

func (e *roomEngine) Check(context.Context, engine.Spec) error { return nil }

func (e *roomEngine) Create(_ context.Context, spec engine.Spec, _ io.Writer) (engine.Attached, error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	if e.room <= 0 {
		e.refused++
		return engine.Attached{}, fmt.Errorf("fake engine: %s: %w", spec.Name, engine.ErrNoRoom)
	}
	e.room--
	e.created++
	scratch, err := os.MkdirTemp(e.t.TempDir(), "scratch-")
	if err != nil {
		return engine.Attached{}, err
	}
	cfg := agent.Config{Launch: []string{"bash"}, Ext: "sh", Dir: spec.Mounts[0].Source, Scratch: scratch,
		Env: []string{"PATH=" + os.Getenv("PATH")}, Quota: e.quota}
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	ctx, cancel := context.WithCancel(context.Background())
	b := &fakeBox{cancel: cancel, in: inW, out: outR, done: make(chan struct{})}
	go func() {
		defer close(b.done)
		_ = agent.Serve(ctx, cfg, inR, outW)
		outW.Close()
		inR.Close()
	}()
	e.boxes[spec.Name] = b
	return engine.Attached{ID: spec.Name, Stdin: inW, Stdout: outR, Done: b.done, Closer: b}, nil
}

func (e *roomEngine) Kill(_ context.Context, id string) error {
	e.mu.Lock()
	b := e.boxes[id]
	e.mu.Unlock()
	if b != nil {
		b.stop()
	}
	return nil
}

func (e *roomEngine) Remove(_ context.Context, id string) error {
	e.mu.Lock()
	b := e.boxes[id]
	delete(e.boxes, id)
	if b != nil && !e.taken {
		e.room++
	}
	e.mu.Unlock()
	if b != nil {
		b.stop()
	}
	return nil
}

func (e *roomEngine) List(context.Context, map[string]string) ([]engine.Sandbox, error) {
	return nil, nil
}
func (e *roomEngine) Wait(context.Context, string) error { return nil }
func (e *roomEngine) Inspect(context.Context, string) (engine.State, error) {
	return engine.State{}, nil
}
func (e *roomEngine) Landlock() bool { return false }

// pauses is a StateKeeper that notes the conversations whose state it
// saved.
type pauses struct {
	mu    sync.Mutex
	convs []string
}

func (p *pauses) Pause(_ context.Context, conv string, gen int64, _ snapshot.Interpreter) (snapshot.Paused, error) {
	p.mu.Lock()
	p.convs = append(p.convs, conv)
	p.mu.Unlock()
	return snapshot.Paused{Gen: gen}, nil
}

func (p *pauses) Resume(context.Context, string, snapshot.Interpreter) (snapshot.Resumed, error) {
	return snapshot.Resumed{}, nil
}

func (p *pauses) saved() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.convs)
}

// idle is a warm sandbox a case starts with.
type idle struct {
	conv, lang string
	kept       bool // its kept interpreter has state
	// adopted: a new conversation adopted it from the pool and has not
	// run in it yet; else the conversation has run.
	adopted bool
}

// TestMakeRoom: a run whose sandbox the engine has no room for removes
// idle sandboxes to make some — the warm one idle longest, of its
// language first, its kept state saved; else a pooled one — and tries
// again, a bounded number of times; a pool start never does, and none
// adopted by a new conversation that has not run in it yet is removed.
func TestMakeRoom(t *testing.T) {
	for _, tt := range []struct {
		name string
		// warm: the idle sandboxes, the one idle longest first; pooled:
		// the pool's, by language.
		warm   []idle
		pooled map[string]int
		// room: what the engine has room for once they are made; taken:
		// no removal frees any.
		room  int
		taken bool
		// run: the run's conversation and language; prestart starts a
		// pool's sandbox of that language instead; making: a run is
		// making room meanwhile.
		run, lang        string
		prestart, making bool

		noRoom     bool     // the start fails with ErrNoRoom
		message    string   // in its error
		warmAfter  []string // conversations with a warm sandbox after
		pooledLeft map[string]int
		saved      []string // conversations whose kept state was saved
	}{
		{name: "room enough", warm: []idle{{"a", "python", false, false}}, room: 1, run: "new", lang: "python",
			warmAfter: []string{"a", "new"}},
		{name: "the longest idle of the same language",
			warm: []idle{{"b", "bash", false, false}, {"a", "python", true, false}, {"c", "python", false, false}}, run: "new", lang: "python",
			warmAfter: []string{"b", "c", "new"}, saved: []string{"a"}},
		{name: "the longest idle of another language when none is of its own",
			warm: []idle{{"b", "bash", true, false}, {"c", "bash", false, false}}, run: "new", lang: "python",
			warmAfter: []string{"c", "new"}, saved: []string{"b"}},
		{name: "a pooled one when no warm one is idle, from the largest pool",
			pooled: map[string]int{"python": 1, "bash": 2}, run: "new", lang: "python",
			warmAfter: []string{"new"}, pooledLeft: map[string]int{"python": 1, "bash": 1}},
		{name: "warm ones before pooled ones",
			warm: []idle{{"a", "bash", false, false}}, pooled: map[string]int{"python": 1}, run: "new", lang: "python",
			warmAfter: []string{"new"}, pooledLeft: map[string]int{"python": 1}},
		{name: "nothing idle to remove", room: 0, run: "new", lang: "python",
			noRoom: true, message: "every sandbox here is in use"},
		{name: "room taken by others: a bounded number removed",
			warm: []idle{{"a", "python", false, false}, {"b", "python", false, false}, {"c", "python", false, false},
				{"d", "python", false, false}, {"e", "python", false, false}, {"f", "python", false, false}},
			taken: true, run: "new", lang: "python",
			noRoom: true, message: fmt.Sprintf("after removing %d idle sandboxes", roomTries), warmAfter: []string{"e", "f"}},
		{name: "a pool start removes nothing",
			warm: []idle{{"a", "python", false, false}}, pooled: map[string]int{"python": 1}, lang: "python", prestart: true,
			noRoom: true, warmAfter: []string{"a"}, pooledLeft: map[string]int{"python": 1}},
		{name: "not one adopted and not yet run",
			warm: []idle{{"a", "python", false, true}, {"b", "bash", false, false}, {"c", "python", false, true}},
			run:  "new", lang: "python",
			warmAfter: []string{"a", "c", "new"}},
		{name: "a pooled one when only adopted ones are warm",
			warm: []idle{{"a", "python", false, true}}, pooled: map[string]int{"bash": 1}, run: "new", lang: "python",
			warmAfter: []string{"a", "new"}},
		{name: "nothing to remove when only adopted ones are warm",
			warm: []idle{{"a", "python", false, true}, {"b", "bash", false, true}}, run: "new", lang: "python",
			noRoom: true, message: "every sandbox here is in use", warmAfter: []string{"a", "b"}},
		{name: "a pool start waits for a run making room",
			room: 1, lang: "python", prestart: true, making: true, noRoom: true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			// Before the manager's cleanup, so removed after it: its
			// sandboxes' agents use the folders until they end.
			dirs := t.TempDir()
			eng := newRoomEngine(t)
			keeper := &pauses{}
			m := NewManager(eng, Options{ExecutorID: "test", MaxWarm: WarmLimits{Default: 8},
				MaxPool: WarmLimits{Default: 8}, State: keeper})
			if _, err := m.Discover(t.Context()); err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() {
				m.Close()
				if n := m.Live(); n != 0 {
					t.Errorf("%d sandboxes left tracked", n)
				}
				if live, _, _ := eng.counts(); live != 0 {
					t.Errorf("%d sandboxes left in the engine", live)
				}
			})
			folder := func(name string) string {
				dir := filepath.Join(dirs, name)
				if err := os.MkdirAll(dir, 0o755); err != nil {
					t.Fatal(err)
				}
				return dir
			}
			run := func(conv, lang, dir string) error {
				oc, err := m.Run(t.Context(), Request{RunID: "r-" + conv, ConversationID: conv, Language: lang,
					Code: "echo ok", Timeout: time.Minute, DataDir: dir}, func(Stream, []byte) {})
				// The fake's agent cannot show a run clean (it does not
				// sweep the test's processes): its sandbox is removed
				// after, and another started for the conversation in the
				// background (refill), in the room the removal gave back.
				if err == nil && oc.ExitCode != 0 {
					t.Fatalf("run of %s: %+v", conv, oc)
				}
				return err
			}

			eng.setRoom(len(tt.warm)+total(tt.pooled), false)
			begin := time.Now().Add(-time.Hour)
			// A conversation's warm sandbox, as a new conversation gets
			// one: a pooled one adopted (its slot the conversation's
			// folder), then, unless the case wants it adopted only, a run
			// in it, which takes it as a real run does; the fake's run
			// leaves it unclean, and the sandbox that stays warm is the
			// refill started for the conversation after.
			for i, w := range tt.warm {
				dir := folder("slot-" + w.conv)
				if err := m.Prestart(t.Context(), w.lang, dir); err != nil {
					t.Fatal(err)
				}
				if !m.Adopt(t.Context(), w.conv, w.lang, func(slot string) (string, error) { return slot, nil }) {
					t.Fatalf("%s did not adopt its sandbox", w.conv)
				}
				if !w.adopted {
					if err := run(w.conv, w.lang, dir); err != nil {
						t.Fatalf("run of %s: %v", w.conv, err)
					}
					m.bg.Wait() // the refill
				}
				m.mu.Lock()
				sb := m.warm[warmKey{w.conv, w.lang}]
				if sb == nil {
					m.mu.Unlock()
					t.Fatalf("%s's sandbox did not stay warm", w.conv)
				}
				if sb.adopted != w.adopted {
					m.mu.Unlock()
					t.Fatalf("%s's sandbox: adopted %v, want %v", w.conv, sb.adopted, w.adopted)
				}
				sb.idleFrom = begin.Add(time.Duration(i) * time.Minute)
				if w.kept {
					sb.keptGen = 1
				}
				m.mu.Unlock()
			}
			for _, lang := range []string{"python", "bash"} {
				for i := range tt.pooled[lang] {
					if err := m.Prestart(t.Context(), lang, folder(fmt.Sprintf("slot-%s-%d", lang, i))); err != nil {
						t.Fatal(err)
					}
				}
			}
			eng.setRoom(tt.room, tt.taken)
			if tt.making {
				m.mu.Lock()
				m.roomWanted++
				m.mu.Unlock()
			}
			_, createdBefore, _ := eng.counts()

			var err error
			if tt.prestart {
				err = m.Prestart(t.Context(), tt.lang, folder("slot-new"))
			} else {
				err = run(tt.run, tt.lang, folder(tt.run))
			}
			if errors.Is(err, engine.ErrNoRoom) != tt.noRoom || !tt.noRoom && err != nil {
				t.Fatalf("start: %v; want no room: %v", err, tt.noRoom)
			}
			if err != nil && !strings.Contains(err.Error(), tt.message) {
				t.Errorf("error %q does not say %q", err, tt.message)
			}
			m.bg.Wait() // the refill
			var warmAfter []string
			m.mu.Lock()
			for k := range m.warm {
				warmAfter = append(warmAfter, k.conversation)
			}
			pooledLeft := map[string]int{}
			for lang, p := range m.policy.pool {
				if len(p) > 0 {
					pooledLeft[lang] = len(p)
				}
			}
			m.mu.Unlock()
			slices.Sort(warmAfter)
			if !slices.Equal(warmAfter, tt.warmAfter) {
				t.Errorf("warm after: %v, want %v", warmAfter, tt.warmAfter)
			}
			if !maps.Equal(pooledLeft, tt.pooledLeft) && len(pooledLeft)+len(tt.pooledLeft) > 0 {
				t.Errorf("pooled after: %v, want %v", pooledLeft, tt.pooledLeft)
			}
			if saved := keeper.saved(); !slices.Equal(saved, tt.saved) {
				t.Errorf("kept state saved of %v, want %v", saved, tt.saved)
			}
			if _, created, _ := eng.counts(); tt.making && created != createdBefore {
				t.Errorf("a pool start made a sandbox while a run was making room")
			}
			// Every removal reached the engine: nothing the manager let go
			// holds room.
			if live, _, _ := eng.counts(); live != m.Live() {
				t.Errorf("the engine holds %d sandboxes, the manager tracks %d", live, m.Live())
			}
			if tt.making {
				m.mu.Lock()
				m.roomWanted--
				m.mu.Unlock()
			}
		})
	}
}

func total(m map[string]int) int {
	n := 0
	for _, v := range m {
		n += v
	}
	return n
}

// TestRunPastQuota: a run whose agent stopped it past its folder's
// quota says which bound, and nothing else the agent says passes.
func TestRunPastQuota(t *testing.T) {
	dir := t.TempDir()
	eng := newRoomEngine(t)
	eng.quota = agent.Quota{Entries: 50}
	eng.setRoom(4, false)
	m := NewManager(eng, Options{ExecutorID: "test", MaxWarm: WarmLimits{Default: 1}})
	if _, err := m.Discover(t.Context()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { m.Close() })
	for _, tt := range []struct{ code, want string }{
		{code: "touch $(seq 1 100)", want: agent.QuotaEntries},
		{code: "rm -f *; echo ok", want: ""},
	} {
		oc, err := m.Run(t.Context(), Request{RunID: "r", ConversationID: "c", Language: "bash",
			Code: tt.code, Timeout: time.Minute, DataDir: dir}, func(Stream, []byte) {})
		if err != nil || oc.Quota != tt.want {
			t.Errorf("run %q: %+v, %v; want quota %q", tt.code, oc, err, tt.want)
		}
		m.bg.Wait() // the refill
	}
}
