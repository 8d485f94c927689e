package runs

import (
	"context"

	"github.com/runbox-dev/runbox"
)

// Admission is the stage every run passes before it is queued, whichever
// door it came by: Submit (run_code, start_run, POST /v1/runs, the
// commands tools), SubmitBatch, SubmitTemplate. Its checks, in the order
// they run; each refuses the run with a *runbox.Error, or settles part of
// its spec, and each is a function of its own:
//
//  1. timeout: tierTimeout — the tier's max_timeout_seconds, and its
//     default (a background run is held by the day's seconds instead);
//  2. shape: normalize — language, code, stdin, environment, ids,
//     timeout within the service's limits;
//  3. egress: AdmitEgress — the network it asks for within its client's
//     allowlist, its packages;
//  4. secrets: AdmitSecrets — the secrets its client's tier lists;
//  5. owner: ConversationKey — its conversation is the caller's, and
//     reachable from the caller's MCP session;
//  6. tier: admitRun — runs in flight, the seconds left today (its
//     timeout held to them), new conversations an hour, storage;
//  7. sandboxes: admitSandbox — SANDBOX_MAX_SESSIONS;
//  8. language: checkLanguage — a live executor runs it, or its fallback;
//  9. callback: callback, admitWebhooks — where its webhooks go, and its
//     client's bound on webhooks not yet delivered;
//  10. queue: the store, as it records the run (store.Runs.CreateRun) —
//     its conversation's waiting runs, its client's queue in runs and
//     bytes, the seconds its timeout reserves; atomically, as no check
//     before it can be.
//
// A batch passes the same, in three parts: the batch as a whole first
// (its size and whether it can fit its client's queue: admitQueued), then
// each run (1–5 and 8: batchRun), then the batch as a whole again (6 and
// 7 for all its runs at once, the seconds their timeouts reserve:
// admitBatch; 9: batchCallbacks; 10: store.Batches.CreateBatch).

// admitted is a run that passed admission but for the store's checks:
// its spec as it will be recorded, and where its webhooks go.
type admitted struct {
	spec     runbox.Spec
	callback runbox.Callback
}

// admit takes a run submitted alone through admission's steps 1 to 9.
func (s *Service) admit(ctx context.Context, spec runbox.Spec, idempotencyKey string) (admitted, error) {
	if len(idempotencyKey) > 200 {
		return admitted{}, runbox.Errorf(runbox.EInvalid, "idempotency_key is longer than 200 bytes")
	}
	if err := tierTimeout(ctx, &spec); err != nil {
		return admitted{}, err
	}
	spec, err := s.normalize(spec)
	if err != nil {
		return admitted{}, err
	}
	if err := s.AdmitEgress(ctx, &spec); err != nil {
		return admitted{}, err
	}
	if err := s.AdmitSecrets(ctx, &spec); err != nil {
		return admitted{}, err
	}
	if spec.ConversationID, err = ConversationKey(ctx, spec.ConversationID); err != nil {
		return admitted{}, err
	}
	if err := s.admitRun(ctx, &spec); err != nil {
		s.limited(ctx, err)
		return admitted{}, err
	}
	if err := s.admitSandbox(ctx, spec.ConversationID); err != nil {
		return admitted{}, err
	}
	if spec.Language, err = s.checkLanguage(ctx, spec.Language); err != nil {
		return admitted{}, err
	}
	cb, err := s.callback(ctx, spec.CallbackURL, true)
	if err != nil {
		return admitted{}, err
	}
	if err := s.admitWebhooks(ctx, webhooksOf(cb)); err != nil {
		return admitted{}, err
	}
	return admitted{spec: spec, callback: cb}, nil
}
