package runs

import (
	"context"
	"time"

	"github.com/runbox-dev/runbox"
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
	spec := runbox.Spec{
		Language: runbox.TemplateLanguage(t.Name), Code: TemplateStart, ConversationID: key,
		TimeoutSeconds: max(int(ttl/time.Second), 1), Background: true, Detach: true,
	}
	if err := s.admitRun(ctx, &spec); err != nil {
		s.limited(ctx, err)
		return runbox.Run{}, err
	}
	return s.enqueue(ctx, spec, "", runbox.Callback{})
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

// A background run that asks for no timeout gets MaxBackground, which
// admitRun holds to what the caller's tier has left of its run-seconds
// today: a run reserves its timeout of the day until it ends.
