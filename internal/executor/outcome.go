package executor

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/runbox-dev/runbox"
	"github.com/runbox-dev/runbox/internal/agent"
	"github.com/runbox-dev/runbox/internal/sandbox"
	"github.com/runbox-dev/runbox/internal/sandbox/engine"
)

// ending is what happened to a run's program, for outcome.
type ending struct {
	outcome sandbox.Outcome
	err     error // the sandbox's failure, if it failed
	// cause is why the run's context ended (context.Cause); nil while it
	// lasts.
	cause   error
	timeout int   // the run's timeout, in seconds
	quota   int64 // the conversation's quota, in bytes
	files   int   // and in entries
	idle    string
	now     time.Time
}

// outcome is the last stage of a run: from how its program ended, the
// run's status and final events, added to st (which holds its output and
// files). It decides, and does nothing else.
func outcome(st runState, x ending) runState {
	oc := x.outcome
	if x.err != nil && x.cause != nil {
		// Cancelled while its sandbox was starting.
		oc.Cancelled, x.err = true, nil
	}
	switch {
	case errors.Is(x.err, engine.ErrNoRoom):
		return st.fail(x.err, errNoRoomMessage, x.now)
	case x.err != nil:
		return st.fail(x.err, "the sandbox failed while running the program", x.now)
	case oc.Quota == agent.QuotaEntries:
		st.atQuota(fmt.Sprintf("%d entries", x.files), quotaNotKept, x.now)
	case oc.Quota != "":
		st.atQuota(fmt.Sprintf("%d bytes", x.quota), quotaNotKept, x.now)
	case oc.Cancelled:
		return cancelled(st, x)
	case oc.TimedOut:
		st.status = runbox.StatusTimedOut
		st.result.TimedOut = true
		st.events = append(st.events, runbox.Event{TS: x.now, Type: runbox.EventTimeout,
			Message: fmt.Sprintf("the program ran longer than %ds and was killed", x.timeout)})
	default:
		st.result.ExitCode = oc.ExitCode
		st.result.OOMKilled = oc.OOMKilled
		st.result.Phase = oc.Phase
		st.result.Success = oc.ExitCode == 0 && !oc.OOMKilled
		st.status = runbox.StatusFailed
		if st.result.Success {
			st.status = runbox.StatusSucceeded
		}
		code, ms := oc.ExitCode, oc.Duration.Milliseconds()
		st.events = append(st.events, runbox.Event{TS: x.now, Type: runbox.EventExit, ExitCode: &code, DurationMS: &ms})
	}
	return st
}

// errNoRoomMessage is a run's error when no sandbox could be started for
// it: the engine had no room, and no idle sandbox was left to remove.
const errNoRoomMessage = "no room for another sandbox: every sandbox of this executor is in use; try again later"

// cancelled is the outcome of a run whose context ended: stopped at the
// quota, idle, asked to by its client, or for a reason of the service's
// (a shutdown), which is its error.
func cancelled(st runState, x ending) runState {
	switch cause := x.cause; {
	case errors.Is(cause, errQuota):
		st.atQuota(fmt.Sprintf("%d bytes", x.quota), quotaStopped, x.now)
	case errors.Is(cause, errIdle):
		st.status = runbox.StatusTimedOut
		st.result.TimedOut = true
		st.events = append(st.events, runbox.Event{TS: x.now, Type: runbox.EventTimeout, Message: x.idle})
	case !errors.Is(cause, context.Canceled) && cause != nil && !errors.Is(cause, errUserCancel):
		return st.fail(cause, cause.Error(), x.now)
	default:
		st.status = runbox.StatusCancelled
		st.result.Cancelled = true
		st.events = append(st.events, runbox.Event{TS: x.now, Type: runbox.EventCancelled})
	}
	return st
}
