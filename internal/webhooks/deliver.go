package webhooks

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"net"
	"net/http"
	"strconv"
	"syscall"
	"time"

	"github.com/runbox-dev/runbox"
	"github.com/runbox-dev/runbox/internal/sessions"
	"github.com/runbox-dev/runbox/internal/webhooks/signature"
)

const (
	// maxDelay bounds the wait between two attempts.
	maxDelay = time.Hour
	// maxBodyRead bounds what is read of a receiver's answer.
	maxBodyRead = 64 << 10
	// userAgent names the sender.
	userAgent = "runbox-webhooks/1"
	// recordTimeout bounds recording an attempt in Redis once it is made
	// (not the attempt itself: Options.AttemptTimeout).
	recordTimeout = 10 * time.Second
)

// delay is the wait before attempt n+1 of webhook id (n counts the
// retries made): Backoff doubled n times, at most maxDelay, spread by
// ±25% — by a hash of id and n rather than at random, so that the handler
// knows the wait the queue will make (RetryDelay) when it decides whether
// another attempt fits in the webhook's time.
func (s *Service) delay(id string, n int) time.Duration {
	d := s.o.Backoff
	for range min(n, 40) {
		if d *= 2; d >= maxDelay {
			d = maxDelay
			break
		}
	}
	h := fnv.New64a()
	h.Write([]byte(id + "#" + strconv.Itoa(n)))
	spread := 0.75 + float64(h.Sum64()%1001)/2000
	return time.Duration(float64(d) * spread)
}

// RetryDelay is the wait before attempt n+1 of webhook id, for the
// queue's worker.
func (s *Service) RetryDelay(id string, n int) time.Duration { return s.delay(id, n) }

// Deliver makes one attempt to deliver webhook id, which was retried
// times before; it is the queue's worker's handler. A 2xx answer
// delivers it and a 410 ends it (the receiver is gone); anything else is
// retried, after delay, while the webhook's time (WEBHOOK_RETRY_FOR since
// it was relayed or asked for again) lasts: past it the error is final.
// Every attempt is recorded. A webhook whose client has its share of the
// workers busy, or whose target's circuit is open, is not attempted: the
// error is a *Deferred (fair.go).
func (s *Service) Deliver(ctx context.Context, id string, retried int) (bool, error) {
	w, err := s.store.Webhook(ctx, id)
	if errors.Is(err, runbox.ErrWebhookNotFound) {
		s.log.Warn("webhook expired before it was delivered", "webhook", id)
		return false, nil
	}
	if err != nil {
		return false, err
	}
	if w.State != runbox.WebhookPending {
		return false, nil // done with: this task is a stale copy
	}
	since := w.Since
	if since.IsZero() {
		since = w.Created
	}
	p, wait, why := s.fair.take(w.Client, w.URL, since.Add(s.o.RetryFor))
	if p == nil {
		s.metrics.deferred.WithLabelValues(w.Client, why).Inc()
		return false, &Deferred{For: wait, Why: why}
	}
	h := untried
	defer func() { s.fair.done(p, h) }()
	n, err := s.store.BeginAttempt(ctx, w.ID)
	if err != nil {
		return false, err
	}
	start := s.o.Clock.Now()
	d := runbox.Delivery{WebhookID: w.ID, Type: w.Type, Attempt: n, At: start.UTC()}
	code, final, err := s.attempt(ctx, w, start)
	d.DurationMS = s.o.Clock.Since(start).Milliseconds()
	d.StatusCode = code
	var state string
	state, h = judge(&d, code, final, err)
	if state == "" && start.Add(s.delay(w.ID, retried)).After(since.Add(s.o.RetryFor)) {
		state = runbox.WebhookFailed
		d.Error += "; given up after " + s.o.RetryFor.String()
	}
	// Recorded with a context of its own: the attempt was made.
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), recordTimeout)
	defer cancel()
	if err := s.store.RecordAttempt(rctx, d, s.ttl()); err != nil {
		s.log.Warn("record a webhook's attempt", "webhook", w.ID, "err", err)
	}
	s.metrics.attempt(w.Client, outcome(state), time.Duration(d.DurationMS)*time.Millisecond)
	if state == "" {
		s.log.Debug("webhook not delivered; retried", "webhook", w.ID, "attempt", n, "error", d.Error)
		return false, errors.New(d.Error)
	}
	if err := s.store.EndWebhook(rctx, w, state); err != nil {
		return false, err
	}
	s.log.Debug("webhook done with", "webhook", w.ID, "state", state, "attempts", n)
	if state == runbox.WebhookFailed {
		return true, errors.New(d.Error)
	}
	return false, nil
}

// judge says what an attempt's answer (code, or err, final when no retry
// can mend it) comes to — the webhook's new state, "" while it is to be
// retried — and what it told of the target; it writes the attempt's
// error into d.
func judge(d *runbox.Delivery, code int, final bool, err error) (string, health) {
	switch {
	case err != nil && final:
		d.Error = err.Error()
		return runbox.WebhookFailed, untried
	case err != nil:
		d.Error = err.Error()
		return "", failing
	case code >= 200 && code < 300:
		return runbox.WebhookDelivered, answered
	case code == http.StatusGone:
		d.Error = "the receiver answered 410 Gone: not tried again"
		return runbox.WebhookGone, answered
	}
	d.Error = "the receiver answered " + strconv.Itoa(code)
	if code >= 300 && code < 400 {
		d.Error += ": redirects are not followed"
	}
	if code >= 500 || code == http.StatusTooManyRequests {
		return "", failing
	}
	return "", answered
}

// Deferred is a webhook not attempted now (fair.go): its client has its
// share of the api's workers busy, or its target's circuit is open. The
// queue hands it back to wait For, not counted as a retry.
type Deferred struct {
	For time.Duration
	Why string // client_busy, circuit_open
}

func (d *Deferred) Error() string {
	return "deferred for " + d.For.Round(time.Millisecond).String() + ": " + d.Why
}

// Defer is how long the webhook waits before it is looked at again
// (queue.WebhookHandler).
func (d *Deferred) Defer() time.Duration { return d.For }

func outcome(state string) string {
	if state == "" {
		return "retry"
	}
	return state
}

// attempt posts webhook w once, at now, and returns the receiver's status
// code. An error that no retry can mend (the callback no longer allowed,
// no secret to sign with, the record gone) is final.
func (s *Service) attempt(ctx context.Context, w runbox.Webhook, now time.Time) (int, bool, error) {
	c := s.o.Clients[w.Client]
	if c.Secrets.Len() == 0 {
		return 0, true, errors.New("this client has no webhook signing secret any more")
	}
	target, err := s.o.Policy.Parse(w.URL, c.Domains)
	if err != nil {
		return 0, true, errors.New(runbox.ErrorMessage(err) + " (under the settings of now)")
	}
	body, err := s.body(ctx, w)
	if err != nil {
		return 0, true, err
	}
	sig, err := c.Secrets.Sign(w.ID, now, body)
	if err != nil {
		return 0, true, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, target.URL, bytes.NewReader(body))
	if err != nil {
		return 0, true, errors.New("the callback URL cannot be requested")
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", userAgent)
	req.Header.Set(signature.HeaderID, w.ID)
	req.Header.Set(signature.HeaderTimestamp, strconv.FormatInt(now.Unix(), 10))
	req.Header.Set(signature.HeaderSignature, sig)
	resp, err := s.http.Do(req)
	if err != nil {
		return 0, false, errors.New(describe(err, s.o.AttemptTimeout))
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, maxBodyRead))
	resp.Body.Close()
	return resp.StatusCode, false, nil
}

// describe says why a request failed, in words that name no host detail
// beyond what the client gave; timeout is the attempt's bound.
func describe(err error, timeout time.Duration) string {
	if e, ok := errors.AsType[*runbox.Error](err); ok {
		return e.Message
	}
	var ne net.Error
	switch {
	case errors.As(err, &ne) && ne.Timeout():
		return "timed out (" + timeout.String() + ")"
	case errors.Is(err, syscall.ECONNREFUSED):
		return "connection refused"
	}
	return "could not connect or send: " + clip(rootCause(err))
}

// rootCause is the innermost error's text.
func rootCause(err error) string {
	for {
		next := errors.Unwrap(err)
		if next == nil {
			return err.Error()
		}
		err = next
	}
}

// envelope is what a webhook's body says beside its record: what
// happened, when, and the record again under data (Standard Webhooks'
// recommended shape).
type envelope struct {
	Type      string    `json:"type"`
	Timestamp time.Time `json:"timestamp"`
	Data      any       `json:"data"`
}

// marshal writes the body: the record's own fields at the top — the
// contract's "the run's record", for receivers that read it as it is —
// with the envelope's type, timestamp and data beside them, for those
// written to Standard Webhooks. No record has a field of those names.
func (env envelope) marshal() ([]byte, error) {
	rec, err := json.Marshal(env.Data)
	if err != nil {
		return nil, err
	}
	fields := map[string]json.RawMessage{}
	if err := json.Unmarshal(rec, &fields); err != nil {
		return nil, err
	}
	meta, err := json.Marshal(struct {
		Type      string    `json:"type"`
		Timestamp time.Time `json:"timestamp"`
	}{env.Type, env.Timestamp})
	if err != nil {
		return nil, err
	}
	if err := json.Unmarshal(meta, &fields); err != nil {
		return nil, err
	}
	fields["data"] = rec
	return json.Marshal(fields)
}

// body is webhook w's body, made from the record it tells of, the same
// on every attempt: a run's record at its end (or as it started), a
// batch's counts at its end.
func (s *Service) body(ctx context.Context, w runbox.Webhook) ([]byte, error) {
	env := envelope{Type: w.Type}
	switch w.Type {
	case runbox.WebhookBatchCompleted:
		b, err := s.store.Batch(ctx, w.Subject)
		if err != nil {
			return nil, expired(err, "batch")
		}
		env.Timestamp, env.Data = b.FinishedAt, b.Batch
	case runbox.WebhookRunStarted, runbox.WebhookRunCompleted:
		run, err := s.store.Run(ctx, w.Subject)
		if err != nil {
			return nil, expired(err, "run")
		}
		run = Public(run)
		env.Timestamp = run.FinishedAt
		if w.Type == runbox.WebhookRunStarted {
			run.Status, run.Result, run.FinishedAt = runbox.StatusRunning, nil, time.Time{}
			env.Timestamp = run.StartedAt
		}
		env.Data = run
	default:
		return nil, fmt.Errorf("webhook of unknown type %q", w.Type)
	}
	return env.marshal()
}

func expired(err error, what string) error {
	if errors.Is(err, runbox.ErrRunNotFound) || errors.Is(err, runbox.ErrBatchNotFound) {
		return fmt.Errorf("the %s's record has expired", what)
	}
	return err
}

// Public is a run's record as its client's receiver sees it: its
// conversation by the id the client gave, or, for a run of an MCP
// session's conversation (the commands tools'), without the session's id
// (sessions.Redact): the receiver is outside the session.
func Public(run runbox.Run) runbox.Run {
	run.ConversationID = publicID(run.ConversationID)
	if run.Result != nil {
		r := *run.Result
		r.ConversationID = publicID(r.ConversationID)
		run.Result = &r
	}
	return run
}

func publicID(key string) string {
	if _, id, ok := runbox.ParseConversationKey(key); ok {
		return sessions.Redact(id)
	}
	return key
}
