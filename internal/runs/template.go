package runs

import (
	"context"
	"time"

	"github.com/runbox-dev/runbox"
	"github.com/runbox-dev/runbox/internal/auth"
)

// TemplateStart is the program of a project's run: every template image
// has this script, which puts the template's files the project lacks into
// /data and starts its dev server.
const TemplateStart = "exec /opt/runbox/template/start\n"

// SubmitTemplate starts the dev server of a project in the conversation
// key (the caller's): the template's image, in the background, for at
// most ttl and what the client's tier has left of its run-seconds today.
func (s *Service) SubmitTemplate(ctx context.Context, key string, t runbox.Template, ttl time.Duration) (runbox.Run, error) {
	if !owns(ctx, key) {
		return runbox.Run{}, runbox.Errorf(runbox.ENotFound, "no such conversation")
	}
	if err := s.admitRun(ctx, key); err != nil {
		s.Metrics.Limited(client(ctx), runbox.ErrorCode(err))
		return runbox.Run{}, err
	}
	timeout, err := s.backgroundTimeout(ctx, ttl)
	if err != nil {
		return runbox.Run{}, err
	}
	return s.enqueue(ctx, runbox.Spec{
		Language: runbox.TemplateLanguage(t.Name), Code: TemplateStart, ConversationID: key,
		TimeoutSeconds: timeout, Background: true, Detach: true,
	}, "", runbox.Callback{})
}

// MaxBackground bounds a background run however busy it is: a server
// runs at most a day.
const MaxBackground = 24 * time.Hour

// maxTimeout is the longest timeout a run may ask for, and its default:
// a background one MaxBackground, a command the commands' limit, any
// other the service's limit.
func maxTimeout(spec runbox.Spec, l Limits) int {
	switch {
	case spec.Background:
		return int(MaxBackground / time.Second)
	case spec.Command && l.MaxCommandTimeoutSeconds > 0:
		return l.MaxCommandTimeoutSeconds
	}
	return l.MaxTimeoutSeconds
}

// backgroundLimit holds a background run's timeout to what the caller's
// tier has left of its run-seconds today (MaxBackground when it asks for
// none); a tier with none left is refused as any run would be.
func (s *Service) backgroundLimit(ctx context.Context, spec *runbox.Spec) error {
	limit := MaxBackground
	switch asked := time.Duration(spec.TimeoutSeconds) * time.Second; {
	case asked > MaxBackground:
		return nil // refused as too long (normalize)
	case asked > 0:
		limit = asked
	}
	secs, err := s.backgroundTimeout(ctx, limit)
	if err != nil {
		return err
	}
	if spec.TimeoutSeconds == 0 || secs < spec.TimeoutSeconds {
		spec.TimeoutSeconds = secs
	}
	return nil
}

// backgroundTimeout is the time a background run may take: at most
// limit, and what the caller's tier has left of its run-seconds today.
func (s *Service) backgroundTimeout(ctx context.Context, limit time.Duration) (int, error) {
	secs := int(limit / time.Second)
	if per := auth.Tier(ctx).RunSecondsPerDay; per > 0 {
		used, err := s.store.RunSeconds(ctx, client(ctx))
		if err != nil {
			return 0, err
		}
		secs = min(secs, per-int(used))
	}
	return max(secs, 1), nil
}
