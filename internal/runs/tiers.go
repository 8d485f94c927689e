package runs

import (
	"cmp"
	"context"
	"time"

	"github.com/runbox-dev/runbox"
	"github.com/runbox-dev/runbox/internal/auth"
)

// What a client may do is bounded by its tier (clients.Tier), counted in
// Redis so that every api replica shares the counts. A client past a
// limit gets rate_limited or quota_exceeded with when to come back.

// activeRetry is what a client with its concurrent runs in flight is
// told to wait: runs are short, and a finished one frees its place.
const activeRetry = 2 * time.Second

// storageRetry is what a client over its storage is told to wait: until
// it has deleted files, which it alone can do.
const storageRetry = time.Minute

// tierTimeout holds a run's timeout to its client's tier: a run that asks
// for none gets the tier's longest; one that asks for more is refused. A
// background run is held by what the tier has left of its run-seconds
// (admitRun), not by a run's time limit.
func tierTimeout(ctx context.Context, spec *runbox.Spec) error {
	limit := auth.Tier(ctx).MaxTimeoutSeconds
	switch {
	case limit == 0 || spec.Background:
	case spec.TimeoutSeconds == 0:
		spec.TimeoutSeconds = limit
	case spec.TimeoutSeconds > limit:
		return runbox.Errorf(runbox.EInvalid, "timeout_seconds must be at most %d for this client", limit)
	}
	return nil
}

// bounds are what the caller may have waiting and spend, held by the
// store as it records the caller's runs: its tier's bounds, or the
// service's.
func (s *Service) bounds(ctx context.Context) runbox.ClientBounds {
	tier := auth.Tier(ctx)
	return runbox.ClientBounds{
		MaxQueuedRuns:    cmp.Or(tier.MaxQueuedRuns, s.limits.MaxQueuedRuns),
		MaxQueuedBytes:   cmp.Or(tier.MaxQueuedBytes, s.limits.MaxQueuedBytes),
		ConcurrentRuns:   tier.ConcurrentRuns,
		RunSecondsPerDay: tier.RunSecondsPerDay,
	}
}

// limited counts a refusal of the caller's run for one of its limits.
func (s *Service) limited(ctx context.Context, err error) {
	switch code := runbox.ErrorCode(err); code {
	case runbox.EBusy, runbox.ERateLimited, runbox.EQuotaExceeded, runbox.EMaxSessions:
		s.Metrics.Limited(client(ctx), code)
	}
}

// admitRun holds a new run to its client's tier: runs in flight, its
// timeout within what is left of the day's run seconds, then what
// admitting its conversation asks. The store holds the rest as it
// records the run: the client's queue, and the seconds it reserves.
func (s *Service) admitRun(ctx context.Context, spec *runbox.Spec) error {
	tier, c := auth.Tier(ctx), client(ctx)
	if tier.ConcurrentRuns > 0 {
		n, err := s.store.ActiveRuns(ctx, c)
		if err != nil {
			return err
		}
		if n >= tier.ConcurrentRuns {
			return runbox.Limited(runbox.ERateLimited, activeRetry,
				"this client has %d runs queued or running, its limit; retry when one has finished", n)
		}
	}
	left, err := s.secondsLeft(ctx)
	if err != nil {
		return err
	}
	if left >= 0 {
		// A run takes at most what is left of the day: its timeout is
		// reserved until it ends.
		spec.TimeoutSeconds = min(spec.TimeoutSeconds, left)
	}
	return s.AdmitConversation(ctx, spec.ConversationID)
}

// secondsLeft returns the seconds of the caller's run_seconds_per_day
// neither used today nor reserved by its runs not yet ended, or -1 when
// its tier has no such bound; nothing left is quota_exceeded.
func (s *Service) secondsLeft(ctx context.Context) (int, error) {
	perDay := auth.Tier(ctx).RunSecondsPerDay
	if perDay == 0 {
		return -1, nil
	}
	used, reserved, err := s.store.RunSeconds(ctx, client(ctx))
	if err != nil {
		return 0, err
	}
	left := perDay - int(used) - int(reserved)
	if left > 0 {
		return left, nil
	}
	if used < int64(perDay) {
		return 0, runbox.Limited(runbox.EQuotaExceeded, activeRetry,
			"this client's runs took %d of its %d seconds today (UTC), and its runs under way reserve the rest until they end",
			used, perDay)
	}
	now := time.Now().UTC()
	midnight := time.Date(now.Year(), now.Month(), now.Day()+1, 0, 0, 0, 0, time.UTC)
	return 0, runbox.Limited(runbox.EQuotaExceeded, midnight.Sub(now),
		"this client's runs took %d of its %d seconds today (UTC)", used, perDay)
}

// admitSandbox holds a run of a conversation that holds no sandbox to
// the service's bound on the conversations that do (SANDBOX_MAX_SESSIONS).
func (s *Service) admitSandbox(ctx context.Context, key string) error {
	if s.limits.MaxSessions == 0 {
		return nil
	}
	owner, err := s.store.Owner(ctx, key)
	if err != nil || owner != "" {
		return err
	}
	return s.admitSandboxes(ctx)
}

// admitSandboxes refuses runs of conversations holding no sandbox while
// the service holds SANDBOX_MAX_SESSIONS.
func (s *Service) admitSandboxes(ctx context.Context) error {
	return s.admitNewSandboxes(ctx, 1)
}

// admitSandboxesFor refuses a batch whose conversations holding no
// sandbox (each would get one) would take the service past
// SANDBOX_MAX_SESSIONS.
func (s *Service) admitSandboxesFor(ctx context.Context, keys []string) error {
	if s.limits.MaxSessions == 0 {
		return nil
	}
	n, err := s.store.Unowned(ctx, keys)
	if err != nil {
		return err
	}
	return s.admitNewSandboxes(ctx, n)
}

// admitNewSandboxes refuses n more conversations holding a sandbox past
// SANDBOX_MAX_SESSIONS.
func (s *Service) admitNewSandboxes(ctx context.Context, n int) error {
	if s.limits.MaxSessions == 0 || n == 0 {
		return nil
	}
	held, err := s.store.HeldConversations(ctx)
	if err != nil {
		return err
	}
	if held+n > s.limits.MaxSessions {
		if n == 1 {
			return runbox.Errorf(runbox.EMaxSessions,
				"the server holds %d live sessions, its limit; close one (close_session) or retry once one has been idle for a while", held)
		}
		return runbox.Errorf(runbox.EMaxSessions,
			"the batch starts %d new sessions, and the server holds %d of its %d; split it, or retry once some have been idle for a while",
			n, held, s.limits.MaxSessions)
	}
	return nil
}

// AdmitConversation holds a use of the conversation key (a run, an
// upload) to its client's tier: a new conversation counts against
// new_conversations_per_hour, and the client's files must be within
// storage_bytes.
func (s *Service) AdmitConversation(ctx context.Context, key string) error {
	tier, c := auth.Tier(ctx), client(ctx)
	wait, err := s.store.AllowConversation(ctx, c, key, tier.NewConversationsPerHour, s.store.Retention())
	if err != nil {
		return err
	}
	if wait > 0 {
		return runbox.Limited(runbox.ERateLimited, wait,
			"this client may start %d new conversations an hour; use an existing conversationId or retry later",
			tier.NewConversationsPerHour)
	}
	return s.admitStorage(ctx)
}

// admitStorage holds a use of a conversation to its client's
// storage_bytes.
func (s *Service) admitStorage(ctx context.Context) error {
	tier, c := auth.Tier(ctx), client(ctx)
	if tier.StorageBytes > 0 && s.limits.ClientStorage != nil {
		used, err := s.limits.ClientStorage(ctx, c)
		if err != nil {
			return err
		}
		if used >= tier.StorageBytes {
			return runbox.Limited(runbox.EQuotaExceeded, storageRetry,
				"this client's files take %d of its %d bytes; delete some (close_session) first", used, tier.StorageBytes)
		}
	}
	return nil
}

// AllowCall counts a tool call or REST request of the caller against its
// tier's calls_per_minute.
func (s *Service) AllowCall(ctx context.Context) error {
	c := client(ctx)
	s.Metrics.Call(c)
	limit := auth.Tier(ctx).CallsPerMinute
	if limit == 0 {
		return nil
	}
	wait, err := s.store.AllowCall(ctx, c, limit)
	if err != nil {
		return err
	}
	if wait > 0 {
		s.Metrics.Limited(c, runbox.ERateLimited)
		return runbox.Limited(runbox.ERateLimited, wait, "this client may make %d calls a minute", limit)
	}
	return nil
}

// AdmitForks holds forks of a conversation to the caller's tier before
// anything is copied: their bytes, over its files, within storage_bytes;
// the conversation keys, new, within new_conversations_per_hour (counted
// here, all at once).
func (s *Service) AdmitForks(ctx context.Context, keys []string, bytes int64) error {
	tier, c := auth.Tier(ctx), client(ctx)
	if tier.StorageBytes > 0 && s.limits.ClientStorage != nil {
		used, err := s.limits.ClientStorage(ctx, c)
		if err != nil {
			return err
		}
		if used+bytes > tier.StorageBytes {
			return runbox.Limited(runbox.EQuotaExceeded, storageRetry,
				"the forks would take %d bytes, and this client's files take %d of its %d; delete some (close_session) first",
				bytes, used, tier.StorageBytes)
		}
	}
	wait, err := s.store.AllowConversations(ctx, c, keys, tier.NewConversationsPerHour)
	switch {
	case err != nil:
		return err
	case wait < 0:
		return runbox.Errorf(runbox.ERateLimited,
			"this client may start %d new conversations an hour, fewer than the %d forks asked", tier.NewConversationsPerHour, len(keys))
	case wait > 0:
		return runbox.Limited(runbox.ERateLimited, wait,
			"this client may start %d new conversations an hour, and %d forks would pass it; retry later",
			tier.NewConversationsPerHour, len(keys))
	}
	return nil
}
