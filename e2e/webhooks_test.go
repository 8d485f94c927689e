package e2e

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/runbox-dev/runbox/internal/testenv"
)

// webhookSecret signs the client default's webhooks (WEBHOOK_SECRET).
var webhookSecret = "whsec_" + base64.StdEncoding.EncodeToString([]byte("e2e-webhook-secret-32-bytes-long"))

// hook is a webhook a receiver got.
type hook struct {
	ID, Timestamp, Signature, Path string
	Body                           []byte
	Verified                       bool
	Status                         int  // what the receiver answered; 0 none (held, and the sender went)
	Gone                           bool // the sender went while it was held
}

// envelope is a webhook's body.
type envelope struct {
	Type      string          `json:"type"`
	Timestamp time.Time       `json:"timestamp"`
	Data      json.RawMessage `json:"data"`
}

// hookReceiver is a webhook receiver on loopback. It checks each
// signature as the Standard Webhooks text says, with its own code
// (HMAC-SHA256 of "id.timestamp.body" under the secret's key, base64,
// "v1,"-versioned, any one of the space-separated signatures), refuses
// the first refuse attempts of every webhook with 500 and accepts the
// rest; under /redirect it answers 302 to the api; while held, it keeps
// requests waiting.
type hookReceiver struct {
	srv    *httptest.Server
	secret string
	refuse int

	mu   sync.Mutex
	got  []hook
	hold chan struct{} // while not nil, requests wait for it to close
	down bool          // while set, every request is refused with 503
	// redirectTo is where /redirect sends.
	redirectTo string
}

func newHookReceiver(t *testing.T, refuse int) *hookReceiver {
	r := &hookReceiver{secret: webhookSecret, refuse: refuse}
	r.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		body, _ := io.ReadAll(req.Body)
		h := hook{ID: req.Header.Get("webhook-id"), Timestamp: req.Header.Get("webhook-timestamp"),
			Signature: req.Header.Get("webhook-signature"), Path: req.URL.Path, Body: body}
		h.Verified = verifyHook(r.secret, h)
		r.mu.Lock()
		hold := r.hold
		seen := 0
		for _, g := range r.got {
			if g.ID == h.ID {
				seen++
			}
		}
		switch {
		case req.URL.Path == "/redirect":
			h.Status = http.StatusFound
		case !h.Verified:
			h.Status = http.StatusUnauthorized
		case r.down:
			h.Status = http.StatusServiceUnavailable
		case seen < r.refuse:
			h.Status = http.StatusInternalServerError
		default:
			h.Status = http.StatusOK
		}
		status := h.Status
		if hold != nil {
			h.Status = 0 // not answered yet
		}
		r.got = append(r.got, h)
		i := len(r.got) - 1
		redirectTo := r.redirectTo
		r.mu.Unlock()
		if hold != nil {
			select {
			case <-hold:
			case <-req.Context().Done():
				r.mu.Lock()
				r.got[i].Gone = true // the sender went: never answered
				r.mu.Unlock()
				return
			}
			r.mu.Lock()
			r.got[i].Status = status
			r.mu.Unlock()
		}
		if h.Status == http.StatusFound {
			w.Header().Set("Location", redirectTo)
		}
		w.WriteHeader(h.Status)
	}))
	t.Cleanup(r.srv.Close)
	return r
}

// verifyHook checks a webhook's signature from the specification's text.
func verifyHook(secret string, h hook) bool {
	key, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(secret, "whsec_"))
	if err != nil || h.ID == "" || h.Timestamp == "" {
		return false
	}
	mac := hmac.New(sha256.New, key)
	mac.Write([]byte(h.ID + "." + h.Timestamp + "."))
	mac.Write(h.Body)
	want := base64.StdEncoding.EncodeToString(mac.Sum(nil))
	for _, sig := range strings.Split(h.Signature, " ") {
		if v, s, ok := strings.Cut(sig, ","); ok && v == "v1" && hmac.Equal([]byte(s), []byte(want)) {
			return true
		}
	}
	return false
}

// setDown makes the receiver refuse every request (503), or not.
func (r *hookReceiver) setDown(down bool) {
	r.mu.Lock()
	r.down = down
	r.mu.Unlock()
}

func (r *hookReceiver) port() string {
	_, p, _ := net.SplitHostPort(r.srv.Listener.Addr().String())
	return p
}

// of returns the requests of webhook id so far.
func (r *hookReceiver) of(id string) []hook {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []hook
	for _, h := range r.got {
		if h.ID == id {
			out = append(out, h)
		}
	}
	return out
}

// accepted waits for webhook id to be accepted and returns every request
// of it.
func (r *hookReceiver) accepted(t *testing.T, id string, within time.Duration) []hook {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		got := r.of(id)
		if len(got) > 0 && got[len(got)-1].Status == http.StatusOK {
			return got
		}
		if time.Now().After(deadline) {
			t.Fatalf("webhook %s was not accepted within %v; got %+v", id, within, got)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

func completedID(run string) string { return "msg_" + run + "_completed" }

// webhookEnv are the settings of a service whose default client's
// callbacks may go to recv.test (mapped to the receiver) and localhost.
func webhookEnv(r *hookReceiver) []string {
	return []string{"WEBHOOK_SECRET=" + webhookSecret, "WEBHOOK_ALLOW=recv.test,localhost",
		"WEBHOOK_HOSTS=recv.test=127.0.0.1:" + r.port(), "WEBHOOK_BACKOFF=200ms"}
}

type delivery struct {
	WebhookID  string    `json:"webhook_id"`
	Type       string    `json:"type"`
	Attempt    int       `json:"attempt"`
	At         time.Time `json:"at"`
	StatusCode int       `json:"status_code"`
	DurationMS int64     `json:"duration_ms"`
	Error      string    `json:"error"`
}

// TestWebhooks: a run's end is POSTed to its callback, signed, retried
// until the receiver accepts it, each attempt recorded; runs started
// through MCP and the commands tools carry callbacks too; callbacks that
// point where they must not are refused at submit time; redirects are not
// followed; a delivery can be asked for again.
func TestWebhooks(t *testing.T) {
	rcv := newHookReceiver(t, 2)
	s := start(t, options{env: webhookEnv(rcv)})
	recv := "http://recv.test:" + rcv.port()
	rcv.mu.Lock()
	rcv.redirectTo = s.url + "/healthz" // loopback: were it followed, the api itself
	rcv.mu.Unlock()

	var runID string
	t.Run("signed, retried, recorded", func(t *testing.T) {
		var acc struct {
			RunID string `json:"run_id"`
		}
		if code := s.request("POST", "/v1/runs", map[string]any{"language": "bash", "code": "echo hooked",
			"callback_url": recv + "/hook"}, &acc); code != http.StatusAccepted {
			t.Fatalf("POST /v1/runs: %d", code)
		}
		runID = acc.RunID
		got := rcv.accepted(t, completedID(runID), 90*time.Second)
		if len(got) != 3 {
			t.Fatalf("the receiver got the webhook %d times; want 2 refused, then accepted", len(got))
		}
		for i, h := range got {
			if !h.Verified || h.Path != "/hook" || string(h.Body) != string(got[0].Body) {
				t.Errorf("attempt %d: %+v", i+1, h)
			}
		}
		var env envelope
		var run struct {
			RunID          string `json:"run_id"`
			Status         string `json:"status"`
			ConversationID string `json:"conversationId"`
			Result         result `json:"result"`
		}
		if err := json.Unmarshal(got[0].Body, &env); err != nil || json.Unmarshal(env.Data, &run) != nil {
			t.Fatalf("body %s: %v", got[0].Body, err)
		}
		if env.Type != "run.completed" || run.RunID != runID || run.Status != "succeeded" || run.Result.Stdout != "hooked\n" ||
			strings.Contains(run.ConversationID, "~") || env.Timestamp.IsZero() {
			t.Errorf("body %s", got[0].Body)
		}
		var ds []delivery
		waitFor(t, func() bool {
			ds = nil
			s.request("GET", "/v1/runs/"+runID+"/deliveries", nil, &ds)
			return len(ds) == 3
		})
		for i, want := range []int{500, 500, 200} {
			d := ds[i]
			if d.WebhookID != completedID(runID) || d.Attempt != i+1 || d.StatusCode != want || d.At.IsZero() || (want != 200) != (d.Error != "") {
				t.Errorf("delivery %d: %+v", i, d)
			}
		}
		// Counted once recorded.
		waitFor(t, func() bool {
			_, metrics := get(t, s.url+"/metrics")
			return strings.Contains(string(metrics), `runbox_webhook_attempts_total{client="default",outcome="delivered"} 1`) &&
				strings.Contains(string(metrics), `runbox_webhook_attempts_total{client="default",outcome="retry"} 2`)
		})
	})

	t.Run("asked for again", func(t *testing.T) {
		var re struct {
			WebhookID string `json:"webhook_id"`
			State     string `json:"state"`
		}
		if code := s.request("POST", "/v1/runs/"+runID+"/deliveries", nil, &re); code != http.StatusAccepted || re.WebhookID != completedID(runID) {
			t.Fatalf("redeliver: %d %+v", code, re)
		}
		waitFor(t, func() bool { return len(rcv.of(completedID(runID))) >= 4 })
		// Another client's run is not found.
		if code := s.request("GET", "/v1/runs/run_000000000000000000000000/deliveries", nil, nil); code != http.StatusNotFound {
			t.Errorf("deliveries of no run: %d", code)
		}
	})

	t.Run("MCP and the commands tools", func(t *testing.T) {
		cs := s.session(nil)
		var started struct {
			RunID string `json:"run_id"`
		}
		res := call(t, cs, "start_run", map[string]any{"language": "bash", "code": "echo mcp", "callback_url": recv + "/mcp"}, &started)
		if res.IsError {
			t.Fatalf("start_run: %s", text(res))
		}
		var bg result
		res = call(t, cs, "run_code", map[string]any{"language": "bash", "code": "echo bg", "background": true,
			"callback_url": recv + "/bg"}, &bg)
		if res.IsError {
			t.Fatalf("run_code background: %s", text(res))
		}
		var ex struct {
			ExecutionID string `json:"execution_id"`
		}
		res = call(t, cs, "execute_code_async", map[string]any{"command": "echo cmd", "callback_url": recv + "/cmd"}, &ex)
		if res.IsError {
			t.Fatalf("execute_code_async: %s", text(res))
		}
		for _, id := range []string{started.RunID, bg.RunID, ex.ExecutionID} {
			got := rcv.accepted(t, completedID(id), 90*time.Second)
			if !got[0].Verified {
				t.Errorf("webhook of %s not signed", id)
			}
		}
		// The execution ran in the session's conversation: its webhook
		// does not name the session (its id is what reaches it).
		var env envelope
		var run struct {
			ConversationID string `json:"conversationId"`
		}
		body := rcv.of(completedID(ex.ExecutionID))[0].Body
		if err := json.Unmarshal(body, &env); err != nil || json.Unmarshal(env.Data, &run) != nil || run.ConversationID != "mcp-session" ||
			cs.ID() != "" && strings.Contains(string(body), cs.ID()) {
			t.Errorf("the execution's webhook tells of its conversation as %q (session %q): %s", run.ConversationID, cs.ID(), body)
		}
		res = call(t, cs, "start_run", map[string]any{"language": "bash", "code": "true", "callback_url": "https://127.0.0.1/"}, nil)
		var te toolError
		if b, _ := json.Marshal(res.StructuredContent); !res.IsError || json.Unmarshal(b, &te) != nil || te.Error != "invalid_argument" ||
			!strings.HasPrefix(te.Message, "callback_url: ") {
			t.Errorf("start_run with a loopback callback: %s", text(res))
		}
	})

	t.Run("refused at submit time", func(t *testing.T) {
		apiPort := strings.TrimPrefix(s.url, "http://127.0.0.1:")
		for _, u := range []string{
			"https://127.0.0.1/", "https://2130706433/", "https://0x7f000001/", "https://0177.0.0.1/", "https://127.1/",
			"https://0/", "https://[::1]/", "https://[::ffff:127.0.0.1]/", "https://[0:0:0:0:0:ffff:7f00:1]/",
			"https://169.254.169.254/latest/meta-data/", "https://127.0.0.1.:" + apiPort + "/", "https://evil@127.0.0.1/",
			"https://recv.test@127.0.0.1/", "https://127。0。0。1/", "https://①②⑦.0.0.1/",
			// A name allowed that resolves to loopback (/etc/hosts).
			"https://localhost/", "https://localhost./",
			// The mapped name on another port than its mapping's, or
			// plain http to a name not mapped.
			"http://recv.test:" + apiPort + "/", "https://recv.test:1/", "http://localhost:" + apiPort + "/",
			// Not allowed at all.
			"https://example.com/", "ftp://recv.test/", "recv.test",
		} {
			var e struct {
				Error, Message string
			}
			code := s.request("POST", "/v1/runs", map[string]any{"language": "bash", "code": "true", "callback_url": u}, &e)
			if code != http.StatusBadRequest || e.Error != "invalid_argument" || !strings.HasPrefix(e.Message, "callback_url: ") {
				t.Errorf("callback %q: %d %+v", u, code, e)
			}
		}
	})

	t.Run("redirects are not followed", func(t *testing.T) {
		var acc struct {
			RunID string `json:"run_id"`
		}
		if code := s.request("POST", "/v1/runs", map[string]any{"language": "bash", "code": "true",
			"callback_url": recv + "/redirect"}, &acc); code != http.StatusAccepted {
			t.Fatalf("POST: %d", code)
		}
		var ds []delivery
		waitFor(t, func() bool {
			ds = nil
			s.request("GET", "/v1/runs/"+acc.RunID+"/deliveries", nil, &ds)
			return len(ds) >= 2
		})
		for _, d := range ds {
			if d.StatusCode != http.StatusFound || !strings.Contains(d.Error, "redirects are not followed") {
				t.Errorf("delivery %+v", d)
			}
		}
	})
}

// apiProc returns the api's running process.
func apiProc(t *testing.T, s *service) *proc {
	t.Helper()
	s.mu.Lock()
	defer s.mu.Unlock()
	for i := len(s.procs) - 1; i >= 0; i-- {
		if p := s.procs[i]; strings.HasPrefix(p.name, "api") {
			return p
		}
	}
	t.Fatal("no api process")
	return nil
}

// killAPI ends the api with SIGKILL and waits for it to be gone.
func killAPI(t *testing.T, s *service) {
	t.Helper()
	p := apiProc(t, s)
	if err := p.cmd.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	<-p.done
}

// runStatus reads a run's status from Redis (the api may be down).
func runStatus(t *testing.T, rdb *redis.Client, id string) string {
	t.Helper()
	st, _ := rdb.HGet(context.Background(), "runbox:run:{"+id+"}", "status").Result()
	return st
}

// runStdout is the stdout of a run's recorded result.
func runStdout(t *testing.T, rdb *redis.Client, id string) string {
	t.Helper()
	b, err := rdb.HGet(context.Background(), "runbox:run:{"+id+"}", "result").Bytes()
	if err != nil {
		t.Fatalf("read the result of run %s: %v", id, err)
	}
	var res struct {
		Stdout string `json:"stdout"`
	}
	if err := json.Unmarshal(b, &res); err != nil {
		t.Fatalf("result of run %s: %v", id, err)
	}
	return res.Stdout
}

// TestWebhookCrashes: no webhook is lost when the executor or the api is
// killed between a run's end and its delivery: the webhook is written
// with the run's end, and asynq delivers it at least once, with the same
// webhook-id on every attempt.
func TestWebhookCrashes(t *testing.T) {
	rcv := newHookReceiver(t, 0)
	s := start(t, options{env: webhookEnv(rcv)})
	recv := "http://recv.test:" + rcv.port() + "/crash"
	rdb := testenv.Client(t, s.redisURL)
	post := func(code string) string {
		t.Helper()
		var acc struct {
			RunID string `json:"run_id"`
		}
		if st := s.request("POST", "/v1/runs", map[string]any{"language": "bash", "code": code, "callback_url": recv}, &acc); st != http.StatusAccepted {
			t.Fatalf("POST /v1/runs: %d", st)
		}
		return acc.RunID
	}
	status := func(h hook) string { return hookStatus(t, h) }

	t.Run("executor killed", func(t *testing.T) {
		ended := post("echo ended")
		waitFor(t, func() bool { return runStatus(t, rdb, ended) == "succeeded" })
		running := post("echo up; sleep 60")
		waitFor(t, func() bool { return runStatus(t, rdb, running) == "running" })
		victim := s.executors[0]
		kill(t, s, victim)
		if got := rcv.accepted(t, completedID(ended), time.Minute); status(got[0]) != "succeeded" {
			t.Errorf("the webhook of the run that ended says %s", status(got[0]))
		}
		// The watchdog ends the run the executor was running; its end is
		// told of as any other.
		if got := rcv.accepted(t, completedID(running), time.Minute); status(got[0]) != "error" {
			t.Errorf("the webhook of the lost run says %s", status(got[0]))
		}
		p := s.spawn("executor "+victim+" (restarted)", bin.executor, "EXECUTOR_ID="+victim)
		waitFor(t, func() bool { return strings.Contains(p.out.String(), "executor started") })
	})

	t.Run("api killed before the run ends", func(t *testing.T) {
		id := post("sleep 2; echo late")
		waitFor(t, func() bool { return runStatus(t, rdb, id) == "running" })
		killAPI(t, s)
		// The run ends while no api runs: its webhook waits in the outbox.
		waitFor(t, func() bool { return runStatus(t, rdb, id) == "succeeded" })
		if _, err := rdb.ZScore(context.Background(), "runbox:webhooks:outbox", completedID(id)).Result(); err != nil {
			t.Fatalf("the webhook is not in the outbox: %v", err)
		}
		s.spawn("api (restarted)", bin.api)
		s.waitReady()
		if got := rcv.accepted(t, completedID(id), time.Minute); len(got) != 1 || status(got[0]) != "succeeded" {
			t.Errorf("delivered %d times: %+v", len(got), got)
		}
	})

	t.Run("api killed while it delivers", func(t *testing.T) {
		hold := make(chan struct{})
		rcv.mu.Lock()
		rcv.hold = hold
		rcv.mu.Unlock()
		id := post("echo held")
		waitFor(t, func() bool { return len(rcv.of(completedID(id))) == 1 })
		killAPI(t, s)
		// The held request ends with the api's connection, unanswered.
		waitFor(t, func() bool { return rcv.of(completedID(id))[0].Gone })
		rcv.mu.Lock()
		rcv.hold = nil
		rcv.mu.Unlock()
		close(hold)
		s.spawn("api (restarted again)", bin.api)
		s.waitReady()
		// asynq takes the dead api's task back once its lease lapses
		// (30 s, looked for every minute) and it is delivered again.
		got := rcv.accepted(t, completedID(id), 4*time.Minute)
		if len(got) < 2 || got[0].Status != 0 {
			t.Fatalf("got %+v", got)
		}
		for _, h := range got {
			if h.ID != completedID(id) || !h.Verified || string(h.Body) != string(got[0].Body) {
				t.Errorf("attempt %+v", h)
			}
		}
	})
}

// redisAsDeployed is Redis's persistence as docker-compose.yml,
// deploy/redis.Dockerfile and the Kubernetes manifests run it: an AOF,
// fsynced every second.
var redisAsDeployed = []string{"--appendonly", "yes", "--appendfsync", "everysec"}

// TestWebhookRedisRestart: a Redis restart loses no webhook and makes
// no second delivery of one, nor the result of a run that ended while
// Redis was down. Redis persists as deployed; it is shut down as a
// restart does (SIGTERM), then killed (SIGKILL), each time while the
// webhooks of runs that ended wait for their retries (the receiver
// refuses them) and while a run is under way that ends while Redis is
// down, for less than the run's lease. Once Redis is back and the
// receiver accepts, every run's webhook arrives, signed; a run's webhook
// that came more than once came with the same webhook-id and body each
// time: at least once, never two deliveries. The run that ended while
// Redis was down is recorded with its real end — succeeded, its output —
// which its executor recorded once Redis was back, and its webhook says
// so.
func TestWebhookRedisRestart(t *testing.T) {
	rcv := newHookReceiver(t, 0)
	// The run that ends while Redis is down waits for a file the test
	// writes into its conversation's folder: Docker's bind mount.
	s := start(t, options{env: webhookEnv(rcv), redisArgs: redisAsDeployed, engine: "docker"})
	recv := "http://recv.test:" + rcv.port() + "/redis"
	rdb := testenv.Client(t, s.redisURL)
	post := func(conversation, code string) string {
		t.Helper()
		var acc struct {
			RunID string `json:"run_id"`
		}
		if st := s.request("POST", "/v1/runs", map[string]any{"language": "bash", "code": code, "conversationId": conversation,
			"callback_url": recv}, &acc); st != http.StatusAccepted {
			t.Fatalf("POST /v1/runs: %d", st)
		}
		return acc.RunID
	}

	for _, tc := range []struct {
		name string
		sig  os.Signal
	}{{"restarted", syscall.SIGTERM}, {"killed", os.Kill}} {
		t.Run(tc.name, func(t *testing.T) {
			rcv.setDown(true)
			// Runs that end while Redis is up: their webhooks are refused,
			// and wait for their retries.
			var ids []string
			for i := range 3 {
				ids = append(ids, post(fmt.Sprintf("%s-%d", tc.name, i), fmt.Sprintf("echo %s %d", tc.name, i)))
			}
			for _, id := range ids {
				waitForLong(t, time.Minute, func() bool { return len(rcv.of(completedID(id))) > 0 })
			}
			// A run under way, that ends once Redis is down.
			conversation := tc.name + "-late"
			files := filepath.Join(s.root, conversation, "files")
			late := post(conversation, "touch /data/waiting; until [ -e /data/go ]; do sleep 0.05; done; echo late")
			ids = append(ids, late)
			waitForLong(t, time.Minute, func() bool {
				_, err := os.Stat(filepath.Join(files, "waiting"))
				return err == nil
			})

			down := time.Now()
			s.redis.Stop(tc.sig)
			if err := os.WriteFile(filepath.Join(files, "go"), nil, 0o644); err != nil {
				t.Fatal(err)
			}
			// Redis stays down until the executor has tried to record the
			// run's end, and failed.
			executor := proc0(t, s, s.executors[0])
			waitForLong(t, time.Minute, func() bool {
				return slices.ContainsFunc(strings.Split(executor.out.String(), "\n"), func(l string) bool {
					return strings.Contains(l, "record result") && strings.Contains(l, late)
				})
			})
			s.redis.Start()
			// Shorter than the run's lease (8 s) less a heartbeat (2 s): its
			// executor renews it once Redis is back, before the watchdog
			// finds it expired.
			outage := time.Since(down)
			t.Logf("Redis was down for %v", outage.Round(time.Millisecond))
			s.waitReady()
			rcv.setDown(false)

			for _, id := range ids {
				got := rcv.accepted(t, completedID(id), 3*time.Minute)
				checkOneDelivery(t, rcv, id)
				// The webhook tells of the run's end as recorded.
				if want, said := runStatus(t, rdb, id), hookStatus(t, got[0]); said != want {
					t.Errorf("run %s: its webhook says %s, its record %s", id, said, want)
				}
			}
			// Its executor waited for Redis to record the end of the run
			// that ended while Redis was down: not the watchdog, which
			// would have ended it as lost.
			if st, out := runStatus(t, rdb, late), runStdout(t, rdb, late); st != "succeeded" || out != "late\n" {
				t.Errorf("the run that ended while Redis was down (for %v) is recorded %s, with stdout %q; want succeeded, %q",
					outage.Round(time.Millisecond), st, out, "late\n")
			}
		})
	}
}

// hookStatus is the status a run's webhook says it ended with.
func hookStatus(t *testing.T, h hook) string {
	t.Helper()
	var env envelope
	var run struct {
		Status string `json:"status"`
	}
	if json.Unmarshal(h.Body, &env) != nil || json.Unmarshal(env.Data, &run) != nil {
		t.Fatalf("body %s", h.Body)
	}
	return run.Status
}

// checkOneDelivery checks that every request that told of run's end came
// signed, with the run's one webhook-id and the same body: repeats of
// one delivery, not deliveries of their own.
func checkOneDelivery(t *testing.T, r *hookReceiver, run string) {
	t.Helper()
	r.mu.Lock()
	got := append([]hook(nil), r.got...)
	r.mu.Unlock()
	var first []byte
	accepted := 0
	for _, h := range got {
		var env envelope
		var rec struct {
			RunID string `json:"run_id"`
		}
		if json.Unmarshal(h.Body, &env) != nil || json.Unmarshal(env.Data, &rec) != nil {
			t.Fatalf("body %s", h.Body)
		}
		if rec.RunID != run || env.Type != "run.completed" {
			continue
		}
		if h.ID != completedID(run) || !h.Verified {
			t.Errorf("run %s told of as webhook %s (verified %v); want %s, signed", run, h.ID, h.Verified, completedID(run))
		}
		if first == nil {
			first = h.Body
		} else if string(h.Body) != string(first) {
			t.Errorf("run %s told of with another body: %s, then %s", run, first, h.Body)
		}
		if h.Status == http.StatusOK {
			accepted++
		}
	}
	if accepted > 1 {
		// At least once: allowed, with the same id, which receivers
		// deduplicate on.
		t.Logf("run %s: its webhook was accepted %d times", run, accepted)
	}
}
