package webhooks

import (
	"cmp"
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
	"net/netip"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/hibiken/asynq"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/runbox-dev/runbox"
	"github.com/runbox-dev/runbox/internal/egress"
	"github.com/runbox-dev/runbox/internal/queue"
	"github.com/runbox-dev/runbox/internal/store"
	"github.com/runbox-dev/runbox/internal/testenv"
	"github.com/runbox-dev/runbox/internal/webhooks/signature"
)

// Two secrets valid at once (a rotation): receivers hold one each.
var (
	oldSecret = "whsec_" + base64.StdEncoding.EncodeToString([]byte("the-old-secret-of-thirty-two-byt"))
	newSecret = "whsec_" + base64.StdEncoding.EncodeToString([]byte("the-new-secret-of-thirty-two-byt"))
)

// received is a request a receiver got.
type received struct {
	id, timestamp, signature string
	body                     []byte
}

// hang, as a receiver's code, answers nothing: the request is held until
// the sender gives it up.
const hang = 0

// receiver is a webhook receiver on loopback that answers each webhook
// with codes in turn (the last one again once they run out) and keeps
// what it got.
type receiver struct {
	srv   *httptest.Server
	mu    sync.Mutex
	codes []int
	got   []received
	// abandoned counts the requests held (hang) that the sender gave up.
	abandoned int
	// held is how many requests are held now, most the most at once.
	held, most int
	// extra headers of the answers (Location).
	header http.Header
}

func newReceiver(t *testing.T, codes ...int) *receiver {
	r := &receiver{codes: codes, header: http.Header{}}
	r.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		b, _ := io.ReadAll(req.Body)
		r.mu.Lock()
		got := received{req.Header.Get("webhook-id"), req.Header.Get("webhook-timestamp"), req.Header.Get("webhook-signature"), b}
		r.got = append(r.got, got)
		n := 0
		for _, g := range r.got {
			if g.id == got.id {
				n++
			}
		}
		code := r.codes[min(n, len(r.codes))-1]
		for k, v := range r.header {
			w.Header()[k] = v
		}
		r.mu.Unlock()
		if code == hang {
			r.mu.Lock()
			r.held++
			r.most = max(r.most, r.held)
			r.mu.Unlock()
			<-req.Context().Done()
			r.mu.Lock()
			r.abandoned++
			r.held--
			r.mu.Unlock()
			return
		}
		w.WriteHeader(code)
	}))
	t.Cleanup(r.srv.Close)
	return r
}

func (r *receiver) requests() []received {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]received(nil), r.got...)
}

func (r *receiver) port() string {
	_, p, _ := net.SplitHostPort(r.srv.Listener.Addr().String())
	return p
}

// verifies checks a request as a receiver holding secret would, from the
// specification's text (not the library runbox signs with).
func verifies(secret string, r received) bool {
	key, _ := base64.StdEncoding.DecodeString(strings.TrimPrefix(secret, "whsec_"))
	mac := hmac.New(sha256.New, key)
	fmt.Fprintf(mac, "%s.%s.%s", r.id, r.timestamp, r.body)
	want := base64.StdEncoding.EncodeToString(mac.Sum(nil))
	for _, s := range strings.Fields(r.signature) {
		if v, sig, _ := strings.Cut(s, ","); v == "v1" && hmac.Equal([]byte(sig), []byte(want)) {
			return true
		}
	}
	return false
}

// harness is a Service, its relay and worker on miniredis, with a store
// to make runs in.
type harness struct {
	t     *testing.T
	st    *store.Store
	in    *asynq.Inspector
	svc   *Service
	relay *Relay
	reg   *prometheus.Registry
}

// harnessOptions configure a harness: WEBHOOK_HOSTS, WEBHOOK_RETRY_FOR,
// the attempt's timeout (0: the default), WEBHOOK_BACKOFF (0: 50 ms),
// the resolver of other names, and a real Redis (else miniredis).
type harnessOptions struct {
	hosts                      string
	retryFor, attempt, backoff time.Duration
	resolver                   egress.Resolver
	realRedis                  bool
}

// newHarness's attempt is Options.AttemptTimeout (0: the default).
func newHarness(t *testing.T, hosts string, retryFor, attempt time.Duration, resolver egress.Resolver) *harness {
	return startHarness(t, harnessOptions{hosts: hosts, retryFor: retryFor, attempt: attempt, resolver: resolver})
}

// startHarness starts a harness whose clients alice (told of runs'
// starts too), bob, carol and dave may have callbacks to recv.test,
// redirect.test, rebind.example and every name under .test.
func startHarness(t *testing.T, o harnessOptions) *harness {
	var url string
	if o.realRedis {
		url = testenv.Redis(t)
	} else {
		_, url = testenv.Miniredis(t)
	}
	rdb := testenv.Client(t, url)
	conn := store.NewConn(rdb)
	st := store.New(conn)
	h, err := egress.ParseHosts(o.hosts)
	if err != nil {
		t.Fatal(err)
	}
	allow, _ := egress.ParseList("recv.test,redirect.test,rebind.example,*.test")
	secrets, err := signature.Parse([]string{newSecret, oldSecret})
	if err != nil {
		t.Fatal(err)
	}
	reg := prometheus.NewRegistry()
	svc := New(queue.NewWebhooks(conn), st, Options{
		Policy: &Policy{Allow: allow, Hosts: h, Resolver: o.resolver, Own: func() map[netip.Addr]bool { return nil }},
		Clients: map[string]Client{"alice": {Secrets: secrets, Started: true}, "bob": {Secrets: secrets},
			"carol": {Secrets: secrets}, "dave": {Secrets: secrets}},
		Backoff: cmp.Or(o.backoff, 50*time.Millisecond), RetryFor: o.retryFor, AttemptTimeout: o.attempt, Registry: reg,
	})
	w := queue.NewWebhookWorker(conn, svc, svc.log)
	if err := w.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(w.Stop)
	return &harness{t: t, st: st, in: asynq.NewInspectorFromRedisClient(rdb), svc: svc, relay: NewRelay(svc), reg: reg}
}

// endRun makes a run of alice with a callback to url, starts and ends it,
// and relays its webhooks.
func (h *harness) endRun(id, url string) {
	h.t.Helper()
	h.finishRun("alice", id, "~alice~c-"+id, url)
	h.relayAll()
}

// finishRun makes a run of client in conversation key cid with a
// callback to url, and starts and ends it: its webhooks wait in the
// outbox.
func (h *harness) finishRun(client, id, cid, url string) {
	h.t.Helper()
	ctx := context.Background()
	cb, err := h.svc.Callback(ctx, client, url, false)
	if err != nil {
		h.t.Fatal(err)
	}
	if _, _, err := h.st.CreateRun(ctx, runbox.NewRun{Run: runbox.Run{ID: id, ConversationID: cid, Language: "bash", CreatedAt: time.Now()},
		Spec: runbox.Spec{Language: "bash", Code: "true", ConversationID: cid}, Client: client, Callback: cb, MaxWaiting: 1}); err != nil {
		h.t.Fatal(err)
	}
	if c, err := h.st.ClaimFor(ctx, id, "ex", time.Minute, 0); err != nil || !c.OK {
		h.t.Fatal(c, err)
	}
	if _, err := h.st.Finish(ctx, id, runbox.Ending{From: []runbox.Status{runbox.StatusRunning}, Status: runbox.StatusSucceeded,
		Result: &runbox.Result{Success: true, Stdout: "hi\n", RunID: id, ConversationID: cid}, Conversation: cid}); err != nil {
		h.t.Fatal(err)
	}
}

// relayAll relays the outbox into the queue.
func (h *harness) relayAll() {
	h.t.Helper()
	ctx := context.Background()
	h.relay.Pass(ctx)
	if out, _ := h.st.Outbox(ctx, 10); len(out) != 0 {
		h.t.Fatalf("outbox after the relay: %v", out)
	}
}

// waitState waits for webhook id to be in state.
func (h *harness) waitState(id, state string) runbox.Webhook {
	h.t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	for {
		w, err := h.st.Webhook(context.Background(), id)
		if err == nil && w.State == state {
			return w
		}
		if time.Now().After(deadline) {
			h.t.Fatalf("webhook %s: %+v, %v; want %s", id, w, err, state)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func (h *harness) deliveries(run string) []runbox.Delivery {
	h.t.Helper()
	ds, err := h.svc.Deliveries(context.Background(), run, false)
	if err != nil {
		h.t.Fatal(err)
	}
	return ds
}

// TestDeliverRetriesSigned: a receiver that refuses twice and then
// accepts gets the same webhook three times, each signed for either
// secret of the rotation, with its own timestamp; each attempt is
// recorded and counted. Asked for again, it comes a fourth time.
func TestDeliverRetriesSigned(t *testing.T) {
	rcv := newReceiver(t, 500, 503, 200)
	h := newHarness(t, "recv.test=127.0.0.1:"+rcv.port(), time.Hour, 0, nil)
	h.endRun("run_signed", "http://recv.test:"+rcv.port()+"/hook")
	id := runbox.WebhookID("run_signed", runbox.WebhookRunCompleted)
	started := runbox.WebhookID("run_signed", runbox.WebhookRunStarted)
	h.waitState(id, runbox.WebhookDelivered)
	h.waitState(started, runbox.WebhookDelivered)

	var got []received
	for _, r := range rcv.requests() {
		if r.id == id {
			got = append(got, r)
		}
	}
	if len(got) != 3 {
		t.Fatalf("the receiver got the completion %d times", len(got))
	}
	for i, r := range got {
		if !verifies(oldSecret, r) || !verifies(newSecret, r) {
			t.Errorf("attempt %d: signature %q does not verify with both secrets", i+1, r.signature)
		}
		if string(r.body) != string(got[0].body) {
			t.Errorf("attempt %d: another body %s", i+1, r.body)
		}
	}
	var env struct {
		Type      string     `json:"type"`
		Timestamp time.Time  `json:"timestamp"`
		Data      runbox.Run `json:"data"`
	}
	if err := json.Unmarshal(got[0].body, &env); err != nil {
		t.Fatal(err)
	}
	if env.Type != runbox.WebhookRunCompleted || env.Data.ID != "run_signed" || env.Data.Status != runbox.StatusSucceeded ||
		env.Data.ConversationID != "c-run_signed" || env.Data.Result == nil || env.Data.Result.Stdout != "hi\n" ||
		env.Data.Result.ConversationID != "c-run_signed" || env.Timestamp.IsZero() {
		t.Errorf("body %s", got[0].body)
	}
	// The body is the run's record too, as it is, beside the envelope.
	var top runbox.Run
	if err := json.Unmarshal(got[0].body, &top); err != nil || top.ID != "run_signed" || top.Status != runbox.StatusSucceeded ||
		top.Result == nil || top.Result.Stdout != "hi\n" {
		t.Errorf("the body is not the run's record: %s", got[0].body)
	}

	ds := h.deliveries("run_signed")
	var codes []int
	for _, d := range ds {
		if d.WebhookID == id {
			codes = append(codes, d.StatusCode)
			if d.At.IsZero() || (d.StatusCode != 200) != (d.Error != "") {
				t.Errorf("attempt %+v", d)
			}
		}
	}
	if fmt.Sprint(codes) != "[500 503 200]" {
		t.Errorf("recorded codes %v; deliveries %+v", codes, ds)
	}
	// Two of each webhook, its start's and its end's.
	if n := testutil.ToFloat64(h.svc.metrics.attempts.WithLabelValues("alice", "retry")); n != 4 {
		t.Errorf("%v attempts counted as retried", n)
	}

	// Asked for again: delivered again, with the same id.
	if _, err := h.svc.Redeliver(context.Background(), "run_signed", false); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for n := 0; n < 4; {
		n = 0
		for _, r := range rcv.requests() {
			if r.id == id {
				n++
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("redelivered %d times", n-3)
		}
		time.Sleep(20 * time.Millisecond)
	}
	h.waitState(id, runbox.WebhookDelivered)
	if _, err := h.svc.Redeliver(context.Background(), "run_none", false); err != ErrNoWebhook {
		t.Errorf("Redeliver of a run without webhooks: %v", err)
	}
}

// TestDeliverHidesSession: the webhook of a run in an MCP session's
// conversation (the commands tools' executions) does not tell the
// session's id — which is what reaches the session — to the receiver,
// which is in no session: its conversation is "mcp-session" (issue 46:
// it was "mcp-<session id>").
func TestDeliverHidesSession(t *testing.T) {
	rcv := newReceiver(t, 200)
	h := startHarness(t, harnessOptions{hosts: "recv.test=127.0.0.1:" + rcv.port(), retryFor: time.Hour, realRedis: true})
	const sid = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
	h.finishRun("bob", "run_cmd", "~bob~mcp-"+sid, "http://recv.test:"+rcv.port()+"/hook")
	h.relayAll()
	h.waitState(runbox.WebhookID("run_cmd", runbox.WebhookRunCompleted), runbox.WebhookDelivered)
	got := rcv.requests()
	var body struct {
		runbox.Run
		Data runbox.Run `json:"data"`
	}
	if len(got) != 1 || json.Unmarshal(got[0].body, &body) != nil {
		t.Fatalf("the receiver got %+v", got)
	}
	if strings.Contains(string(got[0].body), sid) {
		t.Errorf("the body names the session: %s", got[0].body)
	}
	for _, run := range []runbox.Run{body.Run, body.Data} {
		if run.ConversationID != "mcp-session" || run.Result == nil || run.Result.ConversationID != "mcp-session" {
			t.Errorf("the run is told of as %+v; want conversationId mcp-session", run)
		}
	}
}

// TestDeliverGoneStops: 410 ends the webhook after one attempt.
func TestDeliverGoneStops(t *testing.T) {
	rcv := newReceiver(t, 410)
	h := newHarness(t, "recv.test=127.0.0.1:"+rcv.port(), time.Hour, 0, nil)
	h.endRun("run_gone", "http://recv.test:"+rcv.port()+"/")
	id := runbox.WebhookID("run_gone", runbox.WebhookRunCompleted)
	h.waitState(id, runbox.WebhookGone)
	h.waitState(runbox.WebhookID("run_gone", runbox.WebhookRunStarted), runbox.WebhookGone)
	info, err := h.in.GetTaskInfo(queue.WebhookQueue, id)
	if err != nil || info.State != asynq.TaskStateCompleted {
		t.Fatalf("the task after 410: %+v, %v", info, err)
	}
	if n, _ := h.st.PendingWebhooks(context.Background(), "alice", time.Hour); n != 0 {
		t.Errorf("%d webhooks of alice still pending", n)
	}
}

// TestDeliverNoRedirect: a redirect — here to a loopback server the
// policy would never allow — is not followed: the attempt fails with
// its code.
func TestDeliverNoRedirect(t *testing.T) {
	target := newReceiver(t, 200)
	rcv := newReceiver(t, 302, 200)
	rcv.header.Set("Location", target.srv.URL+"/stolen")
	h := newHarness(t, "redirect.test=127.0.0.1:"+rcv.port(), time.Hour, 0, nil)
	h.endRun("run_redirect", "http://redirect.test:"+rcv.port()+"/")
	id := runbox.WebhookID("run_redirect", runbox.WebhookRunCompleted)
	h.waitState(id, runbox.WebhookDelivered)
	if n := len(target.requests()); n != 0 {
		t.Fatalf("the redirect was followed %d times", n)
	}
	ds := h.deliveries("run_redirect")
	if first := ds[0]; first.StatusCode != 302 || !strings.Contains(first.Error, "redirects are not followed") {
		t.Errorf("first attempt %+v", first)
	}
}

// TestDeliverTimeout: a receiver that never answers has its attempt
// ended by the attempt's timeout — its request given up, the attempt
// recorded as timed out — and the webhook is retried, and delivered when
// the receiver answers.
func TestDeliverTimeout(t *testing.T) {
	const timeout = 200 * time.Millisecond
	rcv := newReceiver(t, hang, 200)
	h := newHarness(t, "recv.test=127.0.0.1:"+rcv.port(), time.Hour, timeout, nil)
	h.endRun("run_hang", "http://recv.test:"+rcv.port()+"/hook")
	id := runbox.WebhookID("run_hang", runbox.WebhookRunCompleted)
	h.waitState(id, runbox.WebhookDelivered)
	h.waitState(runbox.WebhookID("run_hang", runbox.WebhookRunStarted), runbox.WebhookDelivered)

	var ds []runbox.Delivery
	for _, d := range h.deliveries("run_hang") {
		if d.WebhookID == id {
			ds = append(ds, d)
		}
	}
	if len(ds) != 2 {
		t.Fatalf("attempts %+v; want a timed out one and a delivered one", ds)
	}
	if first := ds[0]; first.StatusCode != 0 || first.Error != "timed out ("+timeout.String()+")" {
		t.Errorf("the held attempt was recorded as %+v", first)
	}
	if second := ds[1]; second.Attempt != 2 || second.StatusCode != 200 || second.Error != "" {
		t.Errorf("the retry was recorded as %+v", second)
	}
	var ids []string
	for _, r := range rcv.requests() {
		if r.id == id {
			ids = append(ids, r.id)
		}
	}
	if len(ids) != 2 {
		t.Errorf("the receiver got the completion %d times", len(ids))
	}
	// Both webhooks' first requests were held, and given up by the sender.
	deadline := time.Now().Add(30 * time.Second)
	for {
		rcv.mu.Lock()
		n := rcv.abandoned
		rcv.mu.Unlock()
		if n == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d held requests given up; want 2", n)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// rebinding resolves a name to a public address at first, then to
// loopback: what a DNS rebinding attack does between a check and a
// connection.
type rebinding struct {
	mu    sync.Mutex
	calls int
}

func (r *rebinding) LookupNetIP(context.Context, string, string) ([]netip.Addr, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.calls++
	if r.calls == 1 {
		return []netip.Addr{netip.MustParseAddr("93.184.216.34")}, nil
	}
	return []netip.Addr{netip.MustParseAddr("127.0.0.1")}, nil
}

// TestDeliverRebinding: a name checked at submit time that resolves to
// loopback at delivery is refused at the connection, and the attempt
// says why; given its time, the webhook is given up.
func TestDeliverRebinding(t *testing.T) {
	h := newHarness(t, "", 2*time.Second, 0, &rebinding{})
	h.endRun("run_rebind", "https://rebind.example/hook")
	id := runbox.WebhookID("run_rebind", runbox.WebhookRunCompleted)
	h.waitState(id, runbox.WebhookFailed)
	ds := h.deliveries("run_rebind")
	var last runbox.Delivery
	for _, d := range ds {
		if d.WebhookID == id {
			last = d
			if !strings.Contains(d.Error, "resolves to a loopback address") {
				t.Errorf("attempt %+v", d)
			}
		}
	}
	if !strings.Contains(last.Error, "given up") {
		t.Errorf("last attempt %+v", last)
	}
	info, err := h.in.GetTaskInfo(queue.WebhookQueue, id)
	if err != nil || info.State != asynq.TaskStateArchived {
		t.Fatalf("the task given up: %+v, %v", info, err)
	}
}

// TestDelayGrows: back-off doubles from Backoff, spread by at most a
// quarter, up to maxDelay.
func TestDelayGrows(t *testing.T) {
	s := &Service{o: Options{Backoff: 5 * time.Second}}
	for n, base := range []time.Duration{5 * time.Second, 10 * time.Second, 20 * time.Second, 40 * time.Second} {
		d := s.delay("msg_x", n)
		if d < base*3/4 || d > base*5/4 {
			t.Errorf("delay(%d) = %v; want %v ± 25%%", n, d, base)
		}
		if d != s.delay("msg_x", n) {
			t.Errorf("delay(%d) differs between calls", n)
		}
	}
	if d := s.delay("msg_x", 1000); d > maxDelay*5/4 || d < maxDelay*3/4 {
		t.Errorf("delay(1000) = %v", d)
	}
}
