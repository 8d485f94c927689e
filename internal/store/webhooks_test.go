package store

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/runbox-dev/runbox"
	"github.com/runbox-dev/runbox/internal/store/internal/keys"
)

// TestWebhookWrittenWithTheRun: the webhooks of a run's start and end are
// in the outbox as soon as the claim and the end are recorded — by the
// same scripts — and once only.
func TestWebhookWrittenWithTheRun(t *testing.T) {
	backends(t, func(t *testing.T, s *Store) {
		ctx := context.Background()
		cid := "~dave~hooked"
		_, _, err := s.CreateRun(ctx, runbox.NewRun{
			Run:      runbox.Run{ID: "run_hooked", ConversationID: cid, Language: "bash", CreatedAt: time.Now()},
			Spec:     runbox.Spec{Language: "bash", Code: "true", ConversationID: cid},
			Client:   "dave",
			Callback: runbox.Callback{URL: "https://hooks.example/r", Started: true}, MaxWaiting: 1,
		})
		if err != nil {
			t.Fatal(err)
		}
		newRun(t, s, "run_plain")
		if out, _ := s.Outbox(ctx, 10); len(out) != 0 {
			t.Fatalf("outbox before the start: %v", out)
		}
		if c, err := s.ClaimFor(ctx, "run_hooked", "ex", time.Minute, 0); err != nil || !c.OK {
			t.Fatalf("claim: %+v, %v", c, err)
		}
		started := runbox.WebhookID("run_hooked", runbox.WebhookRunStarted)
		if out, _ := s.Outbox(ctx, 10); !slices.Equal(out, []string{started}) {
			t.Fatalf("outbox after the start = %v", out)
		}
		finish(t, s, "run_hooked", cid, runbox.StatusRunning)
		// Ending it again changes nothing.
		finish(t, s, "run_hooked", cid, runbox.StatusRunning)
		finish(t, s, "run_plain", "c-run_plain", runbox.StatusQueued)
		completed := runbox.WebhookID("run_hooked", runbox.WebhookRunCompleted)
		out, _ := s.Outbox(ctx, 10)
		slices.Sort(out) // by time; within a millisecond, by id
		if !slices.Equal(out, []string{completed, started}) {
			t.Fatalf("outbox after the end = %v", out)
		}
		w, err := s.Webhook(ctx, completed)
		if err != nil || w.Subject != "run_hooked" || w.Type != runbox.WebhookRunCompleted || w.Client != "dave" ||
			w.URL != "https://hooks.example/r" || w.State != runbox.WebhookPending || !w.Since.IsZero() {
			t.Fatalf("webhook %+v, %v", w, err)
		}
		if n, _ := s.PendingWebhooks(ctx, "dave", time.Hour); n != 2 {
			t.Fatalf("PendingWebhooks = %d", n)
		}

		// Relayed: out of the outbox, its retries' clock started, it and
		// the run kept for as long as it may be retried.
		if err := s.Relayed(ctx, completed, 72*time.Hour); err != nil {
			t.Fatal(err)
		}
		if out, _ := s.Outbox(ctx, 10); !slices.Equal(out, []string{started}) {
			t.Fatalf("outbox after the relay = %v", out)
		}
		if w, _ := s.Webhook(ctx, completed); w.Since.IsZero() {
			t.Error("relayed without its clock started")
		}
		for _, k := range []string{webhookKey(completed), keys.Run("run_hooked")} {
			if ttl, _ := s.rdb.TTL(ctx, k).Result(); ttl < 71*time.Hour {
				t.Errorf("%s is kept %v", k, ttl)
			}
		}

		// Attempts are counted and the latest kept.
		for i := range MaxAttemptsKept + 3 {
			n, err := s.BeginAttempt(ctx, completed)
			if err != nil || n != i+1 {
				t.Fatalf("BeginAttempt = %d, %v", n, err)
			}
			if err := s.RecordAttempt(ctx, runbox.Delivery{WebhookID: completed, Attempt: n, StatusCode: 500,
				At: time.Now().Add(time.Duration(i) * time.Second)}, time.Hour); err != nil {
				t.Fatal(err)
			}
		}
		ds, err := s.Deliveries(ctx, started, completed)
		if err != nil || len(ds) != MaxAttemptsKept || ds[0].Attempt != 4 || ds[len(ds)-1].Attempt != MaxAttemptsKept+3 {
			t.Fatalf("Deliveries = %d entries from %+v, %v", len(ds), ds[0], err)
		}

		// Done with: no longer the client's; asked for again: it is.
		if err := s.EndWebhook(ctx, w, runbox.WebhookGone); err != nil {
			t.Fatal(err)
		}
		if n, _ := s.PendingWebhooks(ctx, "dave", time.Hour); n != 1 {
			t.Fatalf("PendingWebhooks after the end = %d", n)
		}
		if err := s.Redeliver(ctx, w, time.Hour); err != nil {
			t.Fatal(err)
		}
		if w, _ := s.Webhook(ctx, completed); w.State != runbox.WebhookPending {
			t.Fatalf("redelivered webhook is %s", w.State)
		}
		if n, _ := s.PendingWebhooks(ctx, "dave", time.Hour); n != 2 {
			t.Fatalf("PendingWebhooks after the redelivery = %d", n)
		}
		if err := s.Redeliver(ctx, runbox.Webhook{ID: "msg_none_completed", Client: "dave"}, time.Hour); err != runbox.ErrWebhookNotFound {
			t.Fatalf("Redeliver of nothing: %v", err)
		}
	})
}
