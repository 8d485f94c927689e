package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/runbox-dev/runbox"
	"github.com/runbox-dev/runbox/internal/store/internal/keys"
)

// Webhooks keeps webhooks: their records, the outbox the relay reads, and
// each one's attempts.
type Webhooks struct{ *base }

// Webhooks tell a client's receiver that a run started or ended, or that
// a batch ended. A webhook is written to an outbox by the same script
// that records what it tells (the run's end: transitionScript; its start:
// claimScript; a batch's last run's end), so that no process dying
// between the two loses it. A relay in the api moves the outbox into
// asynq (internal/webhooks), whose task id is the webhook's id: moving
// one twice makes one task.
//
// Keys (the scripts build them from the prefix, as these functions do):
// the webhook's record runbox:webhook:{<id>} (subject, type, url, client,
// created, since, state, attempts), its recent attempts
// runbox:webhook:{<id>}:attempts, the outbox runbox:webhooks:outbox (ids
// by creation), and each client's webhooks not yet done with
// runbox:client:<client>:webhooks (ids by creation), which bounds what a
// client may have waiting.

func webhookKey(id string) string         { return prefix + "webhook:{" + id + "}" }
func webhookAttemptsKey(id string) string { return prefix + "webhook:{" + id + "}:attempts" }
func clientWebhooksKey(client string) string {
	return prefix + "client:" + client + ":webhooks"
}

const outboxKey = prefix + "webhooks:outbox"

// MaxAttemptsKept bounds the attempts kept per webhook: its latest.
const MaxAttemptsKept = 50

// notifyLua defines notify(), which writes a webhook to the outbox: its
// record, and its id in the outbox and among its client's. A webhook
// already written is left as it is. Scripts that end or start a run
// include it.
//
// p is the key prefix; subject a run or batch id; kind "started" or
// "completed"; typ the event type; now unix ms; ttl seconds.
const notifyLua = `
local function notify(p, subject, kind, typ, url, client, now, ttl)
  local id = 'msg_' .. subject .. '_' .. kind
  local key = p .. 'webhook:{' .. id .. '}'
  if redis.call('EXISTS', key) == 1 then return end
  redis.call('HSET', key, 'id', id, 'subject', subject, 'type', typ, 'url', url, 'client', client,
    'created', now, 'state', 'pending', 'attempts', 0)
  redis.call('EXPIRE', key, ttl)
  redis.call('ZADD', p .. 'webhooks:outbox', now, id)
  local mine = p .. 'client:' .. client .. ':webhooks'
  redis.call('ZADD', mine, now, id)
  redis.call('EXPIRE', mine, ttl)
end
`

// Webhook returns a webhook's record.
func (s *Webhooks) Webhook(ctx context.Context, id string) (runbox.Webhook, error) {
	m, err := s.rdb.HGetAll(ctx, webhookKey(id)).Result()
	if err != nil {
		return runbox.Webhook{}, fmt.Errorf("read webhook %s: %w", id, err)
	}
	if m["id"] == "" {
		return runbox.Webhook{}, runbox.ErrWebhookNotFound
	}
	attempts, _ := strconv.Atoi(m["attempts"])
	return runbox.Webhook{ID: m["id"], Subject: m["subject"], Type: m["type"], URL: m["url"], Client: m["client"],
		Created: msTime(m["created"]), Since: msTime(m["since"]), State: m["state"], Attempts: attempts}, nil
}

// Outbox returns up to n webhooks written and not yet relayed, oldest
// first.
func (s *Webhooks) Outbox(ctx context.Context, n int) ([]string, error) {
	ids, err := s.rdb.ZRange(ctx, outboxKey, 0, int64(n-1)).Result()
	if err != nil {
		return nil, fmt.Errorf("read the webhooks' outbox: %w", err)
	}
	return ids, nil
}

// relayedScript takes a webhook out of the outbox once its task exists,
// starts its retries' clock, and keeps it — and the record it tells of,
// which its body is made from — for as long as it may be retried.
//
// KEYS[1] outbox, KEYS[2] the webhook, KEYS[3] its subject's record
// ARGV[1] webhook id, ARGV[2] now (unix ms), ARGV[3] ttl (s)
var relayedScript = redis.NewScript(`
redis.call('ZREM', KEYS[1], ARGV[1])
if redis.call('EXISTS', KEYS[2]) == 0 then return 0 end
redis.call('HSETNX', KEYS[2], 'since', ARGV[2])
local ttl = tonumber(ARGV[3])
for i = 2, 3 do
  local left = redis.call('TTL', KEYS[i])
  if left >= 0 and left < ttl then redis.call('EXPIRE', KEYS[i], ttl) end
end
return 1
`)

// Relayed records that a webhook's task exists: it leaves the outbox, and
// it and its subject's record are kept for ttl at least. A webhook that
// expired meanwhile is only taken out of the outbox.
func (s *Webhooks) Relayed(ctx context.Context, id string, ttl time.Duration) error {
	w, err := s.Webhook(ctx, id)
	subject := ""
	switch {
	case errors.Is(err, runbox.ErrWebhookNotFound):
	case err != nil:
		return err
	default:
		subject = subjectKey(w)
	}
	if err := relayedScript.Run(ctx, s.rdb, []string{outboxKey, webhookKey(id), orNone(subject)},
		id, s.now().UnixMilli(), int64(ttl/time.Second)).Err(); err != nil {
		return fmt.Errorf("relay webhook %s: %w", id, err)
	}
	return nil
}

// subjectKey is the record a webhook's body is made from.
func subjectKey(w runbox.Webhook) string {
	if w.Type == runbox.WebhookBatchCompleted {
		return batchKey(w.Subject)
	}
	return keys.Run(w.Subject)
}

// orNone stands in for a key a script is given but has none to touch.
func orNone(k string) string {
	if k == "" {
		return prefix + "none"
	}
	return k
}

// BeginAttempt counts an attempt to deliver a webhook and returns its
// number, from 1, across retries and redeliveries.
func (s *Webhooks) BeginAttempt(ctx context.Context, id string) (int, error) {
	n, err := s.rdb.HIncrBy(ctx, webhookKey(id), "attempts", 1).Result()
	if err != nil {
		return 0, fmt.Errorf("count an attempt of webhook %s: %w", id, err)
	}
	return int(n), nil
}

// RecordAttempt keeps what an attempt to deliver a webhook came to; its
// MaxAttemptsKept latest attempts are kept, as long as the webhook.
func (s *Webhooks) RecordAttempt(ctx context.Context, d runbox.Delivery, ttl time.Duration) error {
	b, err := json.Marshal(d)
	if err != nil {
		return err
	}
	key := webhookAttemptsKey(d.WebhookID)
	_, err = s.rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
		p.RPush(ctx, key, b)
		p.LTrim(ctx, key, -MaxAttemptsKept, -1)
		p.Expire(ctx, key, ttl)
		return nil
	})
	if err != nil {
		return fmt.Errorf("record an attempt of webhook %s: %w", d.WebhookID, err)
	}
	return nil
}

// EndWebhook records that a webhook is done with (delivered, failed or
// gone): it no longer counts among its client's.
func (s *Webhooks) EndWebhook(ctx context.Context, w runbox.Webhook, state string) error {
	_, err := s.rdb.TxPipelined(ctx, func(p redis.Pipeliner) error {
		p.HSet(ctx, webhookKey(w.ID), "state", state)
		p.ZRem(ctx, clientWebhooksKey(w.Client), w.ID)
		return nil
	})
	if err != nil {
		return fmt.Errorf("end webhook %s: %w", w.ID, err)
	}
	return nil
}

// redeliverScript asks for a webhook again: it is pending, its retries'
// clock starts anew, and it counts among its client's.
//
// KEYS[1] the webhook, KEYS[2] its client's webhooks
// ARGV[1] now (unix ms), ARGV[2] ttl (s)
var redeliverScript = redis.NewScript(`
local id = redis.call('HGET', KEYS[1], 'id')
if not id then return 0 end
redis.call('HSET', KEYS[1], 'state', 'pending', 'since', ARGV[1])
redis.call('EXPIRE', KEYS[1], ARGV[2])
redis.call('ZADD', KEYS[2], ARGV[1], id)
redis.call('EXPIRE', KEYS[2], ARGV[2])
return 1
`)

// Redeliver marks a webhook to be delivered again (its task is the
// caller's to make), and keeps it and its subject's record for ttl.
func (s *Webhooks) Redeliver(ctx context.Context, w runbox.Webhook, ttl time.Duration) error {
	ok, err := redeliverScript.Run(ctx, s.rdb, []string{webhookKey(w.ID), clientWebhooksKey(w.Client)},
		s.now().UnixMilli(), int64(ttl/time.Second)).Int()
	if err != nil {
		return fmt.Errorf("redeliver webhook %s: %w", w.ID, err)
	}
	if ok == 0 {
		return runbox.ErrWebhookNotFound
	}
	if err := relayedScript.Run(ctx, s.rdb, []string{outboxKey, webhookKey(w.ID), subjectKey(w)},
		w.ID, s.now().UnixMilli(), int64(ttl/time.Second)).Err(); err != nil {
		return fmt.Errorf("redeliver webhook %s: %w", w.ID, err)
	}
	return nil
}

// PendingWebhooks returns how many webhooks of client are not yet done
// with; those older than horizon are no longer counted (their records
// have expired).
func (s *Webhooks) PendingWebhooks(ctx context.Context, client string, horizon time.Duration) (int, error) {
	key := clientWebhooksKey(client)
	pipe := s.rdb.TxPipeline()
	pipe.ZRemRangeByScore(ctx, key, "-inf", strconv.FormatInt(s.now().Add(-horizon).UnixMilli(), 10))
	n := pipe.ZCard(ctx, key)
	if _, err := pipe.Exec(ctx); err != nil {
		return 0, fmt.Errorf("count webhooks of %s: %w", client, err)
	}
	return int(n.Val()), nil
}

// Deliveries returns the recorded attempts of the webhooks ids, oldest
// first.
func (s *Webhooks) Deliveries(ctx context.Context, ids ...string) ([]runbox.Delivery, error) {
	pipe := s.rdb.Pipeline()
	cmds := make([]*redis.StringSliceCmd, len(ids))
	for i, id := range ids {
		cmds[i] = pipe.LRange(ctx, webhookAttemptsKey(id), 0, -1)
	}
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return nil, fmt.Errorf("read deliveries: %w", err)
	}
	out := []runbox.Delivery{}
	for _, c := range cmds {
		for _, raw := range c.Val() {
			var d runbox.Delivery
			if err := json.Unmarshal([]byte(raw), &d); err != nil {
				return nil, fmt.Errorf("read deliveries: %w", err)
			}
			out = append(out, d)
		}
	}
	slices.SortStableFunc(out, func(a, b runbox.Delivery) int { return a.At.Compare(b.At) })
	return out, nil
}
