package runs

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/redis/go-redis/v9"

	"github.com/runbox-dev/runbox"
	"github.com/runbox-dev/runbox/internal/auth"
	"github.com/runbox-dev/runbox/internal/clients"
	"github.com/runbox-dev/runbox/internal/queue"
	"github.com/runbox-dev/runbox/internal/sessions"
	"github.com/runbox-dev/runbox/internal/store"
	"github.com/runbox-dev/runbox/internal/store/stream"
	"github.com/runbox-dev/runbox/internal/testenv"
)

var limits = Limits{MaxCodeBytes: 100, MaxTimeoutSeconds: 60, MaxCommandTimeoutSeconds: 300, MaxStdinBytes: 10, MaxWaiting: 4}

func TestNormalize(t *testing.T) {
	s := NewService(nil, nil, nil, limits, slog.New(slog.DiscardHandler))
	tests := []struct {
		name     string
		spec     runbox.Spec
		wantCode string
		check    func(runbox.Spec) bool
	}{
		{"defaults", runbox.Spec{Language: "Python", Code: "x"}, "", func(s runbox.Spec) bool {
			return s.Language == "python" && s.TimeoutSeconds == 60 && strings.HasPrefix(s.ConversationID, "sess_") && len(s.ConversationID) == 17
		}},
		{"alias", runbox.Spec{Language: "ts", Code: "x"}, "", func(s runbox.Spec) bool { return s.Language == "typescript" }},
		{"javascript alias", runbox.Spec{Language: "Node", Code: "x"}, "", func(s runbox.Spec) bool { return s.Language == "javascript" }},
		{"c++ alias", runbox.Spec{Language: "C++", Code: "x"}, "", func(s runbox.Spec) bool { return s.Language == "cpp" }},
		{"keep_state beyond python", runbox.Spec{Language: "r", Code: "x", KeepState: true}, runbox.EInvalid, nil},
		{"given conversation", runbox.Spec{Language: "bash", Code: "x", ConversationID: "abc_DEF-1"}, "", func(s runbox.Spec) bool { return s.ConversationID == "abc_DEF-1" }},
		{"no language", runbox.Spec{Code: "x"}, runbox.EInvalid, nil},
		{"empty code", runbox.Spec{Language: "bash", Code: " \n\t"}, runbox.EInvalid, nil},
		{"code too large", runbox.Spec{Language: "bash", Code: strings.Repeat("x", 101)}, runbox.ETooLarge, nil},
		{"stdin too large", runbox.Spec{Language: "bash", Code: "x", Stdin: strings.Repeat("x", 11)}, runbox.ETooLarge, nil},
		{"timeout too long", runbox.Spec{Language: "bash", Code: "x", TimeoutSeconds: 61}, runbox.EInvalid, nil},
		{"negative timeout", runbox.Spec{Language: "bash", Code: "x", TimeoutSeconds: -1}, runbox.EInvalid, nil},
		{"traversal in conversation", runbox.Spec{Language: "bash", Code: "x", ConversationID: "../x"}, runbox.EInvalid, nil},
		{"conversation too long", runbox.Spec{Language: "bash", Code: "x", ConversationID: strings.Repeat("a", 65)}, runbox.EInvalid, nil},
		{"env name", runbox.Spec{Language: "bash", Code: "x", Env: map[string]string{"1X": "v"}}, runbox.EInvalid, nil},
		{"reserved env", runbox.Spec{Language: "bash", Code: "x", Env: map[string]string{"RUNBOX_X": "v"}}, runbox.EInvalid, nil},
		{"NUL in env value", runbox.Spec{Language: "bash", Code: "x", Env: map[string]string{"X": "a\x00b"}}, runbox.EInvalid, nil},
		{"a command's time", runbox.Spec{Language: "shell", Code: "x", Command: true}, "", func(s runbox.Spec) bool { return s.TimeoutSeconds == 300 }},
		{"a command's longest", runbox.Spec{Language: "shell", Code: "x", Command: true, TimeoutSeconds: 301}, runbox.EInvalid, nil},
		{"filesystem rules beyond commands", runbox.Spec{Language: "bash", Code: "x", Filesystem: &runbox.Filesystem{}}, runbox.EUnsupported, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := s.normalize(tt.spec)
			if tt.wantCode != "" {
				if runbox.ErrorCode(err) != tt.wantCode {
					t.Errorf("error %v, want %s", err, tt.wantCode)
				}
				return
			}
			if err != nil || !tt.check(got) {
				t.Errorf("Normalize = %+v, %v", got, err)
			}
		})
	}
}

func newService(t *testing.T) (*Service, *store.Store, redis.UniversalClient) {
	t.Helper()
	_, url := testenv.Miniredis(t)
	return newServiceOn(t, url)
}

// newServiceOn is newService on the Redis at url.
func newServiceOn(t *testing.T, url string) (*Service, *store.Store, redis.UniversalClient) {
	t.Helper()
	rdb := testenv.Client(t, url)
	conn := store.NewConn(rdb)
	st := store.New(conn)
	hub := stream.NewHub(conn, st, slog.New(slog.DiscardHandler))
	t.Cleanup(func() { hub.Close() })
	q := queue.NewClient(conn)
	log := slog.New(slog.DiscardHandler)
	return NewService(st, hub, queue.NewScheduler(st, q, log), limits, log), st, rdb
}

func TestSubmit(t *testing.T) {
	s, st, opt := newService(t)
	ctx := context.Background()
	spec := runbox.Spec{Language: "python", Code: "print(1)"}
	if _, err := s.Submit(ctx, spec, ""); runbox.ErrorCode(err) != runbox.EUnavailable {
		t.Fatalf("with no executor: %v, want unavailable", err)
	}
	st.Heartbeat(ctx, runbox.ExecutorInfo{ID: "ex", Runners: []runbox.Runner{{Language: "python"}}}, time.Minute)
	if _, err := s.Submit(ctx, runbox.Spec{Language: "bash", Code: "x"}, ""); runbox.ErrorCode(err) != runbox.EUnknownLanguage ||
		!strings.Contains(runbox.ErrorMessage(err), "available: python") {
		t.Fatalf("unknown language: %v", err)
	}
	// JavaScript runs on the TypeScript runner where no executor offers
	// its own, and on its own where one does. (Another client's runs:
	// the default client's turn is the run below's.)
	other := asClient("js", clients.Tier{})
	st.Heartbeat(ctx, runbox.ExecutorInfo{ID: "ts", Runners: []runbox.Runner{{Language: "typescript"}}}, time.Minute)
	if r, err := s.Submit(other, runbox.Spec{Language: "js", Code: "x"}, ""); err != nil || r.Language != "typescript" {
		t.Fatalf("javascript without its runner: %+v, %v", r, err)
	}
	st.Heartbeat(ctx, runbox.ExecutorInfo{ID: "js", Runners: []runbox.Runner{{Language: "javascript"}}}, time.Minute)
	if r, err := s.Submit(other, runbox.Spec{Language: "javascript", Code: "x"}, ""); err != nil || r.Language != "javascript" {
		t.Fatalf("javascript with its runner: %+v, %v", r, err)
	}
	run, err := s.Submit(ctx, spec, "")
	if err != nil {
		t.Fatal(err)
	}
	info, err := asynq.NewInspectorFromRedisClient(opt).GetTaskInfo(queue.Name, run.ID)
	if err != nil {
		t.Fatalf("task of the run: %v", err)
	}
	if info.MaxRetry != 0 || info.Type != queue.TypeRun {
		t.Errorf("task %+v: want no retries", info)
	}
	p, err := queue.Decode(asynq.NewTask(info.Type, info.Payload))
	if err != nil || p.RunID != run.ID || info.Timeout < 60*time.Second {
		t.Errorf("payload %+v, %v (timeout %v)", p, err, info.Timeout)
	}
	got, err := s.Get(ctx, run.ID)
	if err != nil || got.Status != runbox.StatusQueued {
		t.Errorf("Get = %+v, %v", got, err)
	}
	if _, err := s.Get(ctx, "../../x"); runbox.ErrorCode(err) != runbox.ENotFound {
		t.Errorf("Get of a malformed id: %v", err)
	}

	// An executor runs it; Wait sees every event and returns the result.
	go func() {
		st.Claim(ctx, run.ID, "ex", time.Minute)
		st.Append(ctx, run.ID, runbox.Event{Type: runbox.EventStdout, Data: "1\n"})
		st.Finish(ctx, run.ID, runbox.Ending{From: []runbox.Status{runbox.StatusRunning}, Lease: runbox.LeaseDelete,
			Status: runbox.StatusSucceeded, Result: &runbox.Result{Success: true, Stdout: "1\n", RunID: run.ID}, Conversation: run.ConversationID})
	}()
	var types []string
	res, err := s.Wait(ctx, run.ID, 0, func(ev runbox.Event) { types = append(types, ev.Type) })
	if err != nil || !res.Success || res.Stdout != "1\n" {
		t.Fatalf("Wait = %+v, %v", res, err)
	}
	if strings.Join(types, ",") != "queued,started,stdout,done" {
		t.Errorf("events %v", types)
	}
}

// TestMaxSessions: past SANDBOX_MAX_SESSIONS conversations holding a
// sandbox, a run of another is refused (max_sessions); one of a
// conversation that holds a sandbox goes on.
func TestMaxSessions(t *testing.T) {
	s, st, _ := newService(t)
	s.limits.MaxSessions = 2
	ctx := context.Background()
	beat := func(n int) {
		st.Heartbeat(ctx, runbox.ExecutorInfo{ID: "ex", Runners: []runbox.Runner{{Language: "python"}}, Conversations: n}, time.Minute)
	}
	beat(1)
	if _, err := s.Submit(ctx, runbox.Spec{Language: "python", Code: "x", ConversationID: "held"}, ""); err != nil {
		t.Fatalf("below the limit: %v", err)
	}
	beat(2)
	key, _ := ConversationKey(ctx, "held")
	st.SetOwner(ctx, key, "ex", time.Minute)
	if _, err := s.Submit(ctx, runbox.Spec{Language: "python", Code: "x", ConversationID: "new"}, ""); runbox.ErrorCode(err) != runbox.EMaxSessions {
		t.Fatalf("a new conversation at the limit: %v", err)
	}
	if _, err := s.Submit(ctx, runbox.Spec{Language: "python", Code: "x", ConversationID: "held", Parallel: true}, ""); err != nil {
		t.Fatalf("a conversation with a sandbox at the limit: %v", err)
	}
}

// TestSessionScope: an MCP session's conversation is reached only within
// that session. Another session of the same client — or a call outside
// any session — finds neither its runs (get, cancel, stdin, list) nor
// the conversation, and learns nothing of its id.
func TestSessionScope(t *testing.T) {
	s, st, _ := newService(t)
	ctx := auth.WithClient(context.Background(), clients.Client{Name: "alice"})
	st.Heartbeat(ctx, runbox.ExecutorInfo{ID: "ex", Runners: []runbox.Runner{{Language: "shell"}, {Language: "bash"}}}, time.Minute)
	a := sessions.Ref{Client: "alice", ID: strings.Repeat("A", 26)}
	b := sessions.Ref{Client: "alice", ID: strings.Repeat("B", 26)}
	inA, inB, outside := sessions.With(ctx, a), sessions.With(ctx, b), ctx
	mine, err := s.Submit(inA, runbox.Spec{Language: "shell", Code: "x", ConversationID: sessions.Conversation(a), Interactive: true}, "")
	if err != nil {
		t.Fatal(err)
	}
	shared, err := s.Submit(outside, runbox.Spec{Language: "bash", Code: "x", ConversationID: "shared"}, "")
	if err != nil {
		t.Fatal(err)
	}
	listed := func(ctx context.Context) string {
		list, err := s.List(ctx, "")
		if err != nil {
			t.Fatal(err)
		}
		var ids []string
		for _, r := range list {
			ids = append(ids, r.ID+"@"+r.ConversationID)
		}
		return strings.Join(ids, ",")
	}
	if got := listed(inA); !strings.Contains(got, mine.ID) || !strings.Contains(got, shared.ID) {
		t.Errorf("its own session lists %s", got)
	}
	for name, other := range map[string]context.Context{"another session": inB, "no session": outside} {
		if got := listed(other); strings.Contains(got, mine.ID) || strings.Contains(got, a.ID) || !strings.Contains(got, shared.ID) {
			t.Errorf("%s lists %s", name, got)
		}
		if _, err := s.Get(other, mine.ID); runbox.ErrorCode(err) != runbox.ENotFound {
			t.Errorf("%s: get %v", name, err)
		}
		if _, err := s.Cancel(other, mine.ID); runbox.ErrorCode(err) != runbox.ENotFound {
			t.Errorf("%s: cancel %v", name, err)
		}
		if err := s.SendStdin(other, mine.ID, "x", false); runbox.ErrorCode(err) != runbox.ENotFound {
			t.Errorf("%s: send_stdin %v", name, err)
		}
		if _, err := s.Poll(other, mine.ID, 0, 0); runbox.ErrorCode(err) != runbox.ENotFound {
			t.Errorf("%s: poll %v", name, err)
		}
		if _, err := s.List(other, sessions.Conversation(a)); runbox.ErrorCode(err) != runbox.ENotFound {
			t.Errorf("%s: list of the conversation %v", name, err)
		}
		if _, err := s.Submit(other, runbox.Spec{Language: "bash", Code: "x", ConversationID: sessions.Conversation(a)}, ""); runbox.ErrorCode(err) != runbox.ENotFound {
			t.Errorf("%s: a run in the conversation: %v", name, err)
		}
	}
	// The sessionless scope is the calls' outside any session, not a
	// session's.
	if _, err := s.Submit(inA, runbox.Spec{Language: "bash", Code: "x", ConversationID: "mcp-sessionless"}, ""); runbox.ErrorCode(err) != runbox.ENotFound {
		t.Errorf("a session reached the sessionless scope: %v", err)
	}
	if _, err := s.Submit(outside, runbox.Spec{Language: "bash", Code: "x", ConversationID: "mcp-sessionless"}, ""); err != nil {
		t.Errorf("the sessionless scope: %v", err)
	}
	if err := s.SendStdin(inA, mine.ID, "x", false); err != nil {
		t.Errorf("its own session's stdin: %v", err)
	}
}

// TestFollowAndWait: Wait (a run by its id, its owner checked) and Follow
// (the run Submit returned, not read back) hand every event on and return
// the result as its client sees it — its conversation's id, not the
// store's key for it; Wait finds no run of another client.
func TestFollowAndWait(t *testing.T) {
	s, st, _ := newService(t)
	withExecutor(t, st)
	ctx := asClient("alice", clients.Tier{})
	for _, tt := range []struct {
		name   string
		follow func(runbox.Run, func(runbox.Event)) (*runbox.Result, error)
	}{
		{"Wait", func(run runbox.Run, on func(runbox.Event)) (*runbox.Result, error) { return s.Wait(ctx, run.ID, 0, on) }},
		{"Follow", func(run runbox.Run, on func(runbox.Event)) (*runbox.Result, error) { return s.Follow(ctx, run, on) }},
	} {
		t.Run(tt.name, func(t *testing.T) {
			run, err := s.Submit(ctx, runbox.Spec{Language: "bash", Code: "echo 1", ConversationID: "demo-" + tt.name}, "")
			if err != nil {
				t.Fatal(err)
			}
			if _, err := s.Wait(asClient("bob", clients.Tier{}), run.ID, 0, nil); runbox.ErrorCode(err) != runbox.ENotFound {
				t.Errorf("another client's Wait: %v", err)
			}
			key, err := ConversationKey(ctx, run.ConversationID)
			if err != nil {
				t.Fatal(err)
			}
			go func() {
				st.Claim(ctx, run.ID, "ex", time.Minute)
				st.Append(ctx, run.ID, runbox.Event{Type: runbox.EventStdout, Data: "1\n"})
				st.Finish(ctx, run.ID, runbox.Ending{From: []runbox.Status{runbox.StatusRunning}, Lease: runbox.LeaseDelete,
					Status: runbox.StatusSucceeded, Conversation: key,
					Result: &runbox.Result{Success: true, Stdout: "1\n", RunID: run.ID, ConversationID: key}})
			}()
			var types []string
			res, err := tt.follow(run, func(ev runbox.Event) { types = append(types, ev.Type) })
			if err != nil || res.Stdout != "1\n" || res.ConversationID != "demo-"+tt.name {
				t.Fatalf("%s = %+v, %v; want the output and the conversation's id", tt.name, res, err)
			}
			if strings.Join(types, ",") != "queued,started,stdout,done" {
				t.Errorf("events %v", types)
			}
		})
	}
}
