package executor

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/runbox-dev/runbox"
	"github.com/runbox-dev/runbox/internal/agent"
	"github.com/runbox-dev/runbox/internal/sandbox"
	"github.com/runbox-dev/runbox/internal/sandbox/engine"
)

// TestOutcome: how a program ended decides the run's status, its result's
// flags and its one final event.
func TestOutcome(t *testing.T) {
	now := time.Unix(1700000000, 0)
	broken := errors.New("agent went away")
	for _, tt := range []struct {
		name      string
		x         ending
		status    runbox.Status
		event     string
		message   string
		exit      int
		success   bool
		timedOut  bool
		cancelled bool
		oom       bool
		failed    bool // a service failure, logged
	}{
		{name: "exit 0", x: ending{outcome: sandbox.Outcome{ExitCode: 0, Duration: time.Second}},
			status: runbox.StatusSucceeded, event: runbox.EventExit, exit: 0, success: true},
		{name: "exit 3", x: ending{outcome: sandbox.Outcome{ExitCode: 3, Phase: "compile"}},
			status: runbox.StatusFailed, event: runbox.EventExit, exit: 3},
		{name: "out of memory", x: ending{outcome: sandbox.Outcome{ExitCode: 0, OOMKilled: true}},
			status: runbox.StatusFailed, event: runbox.EventExit, exit: 0, oom: true},
		{name: "timeout", x: ending{outcome: sandbox.Outcome{ExitCode: -1, TimedOut: true}, timeout: 7},
			status: runbox.StatusTimedOut, event: runbox.EventTimeout, exit: -1, timedOut: true,
			message: "the program ran longer than 7s and was killed"},
		{name: "sandbox failed", x: ending{err: broken},
			status: runbox.StatusError, event: runbox.EventError, exit: -1, failed: true,
			message: "the sandbox failed while running the program"},
		{name: "no room for a sandbox", x: ending{err: fmt.Errorf("start a sandbox: %w", engine.ErrNoRoom)},
			status: runbox.StatusError, event: runbox.EventError, exit: -1, failed: true,
			message: errNoRoomMessage},
		{name: "cancelled while the sandbox started", x: ending{err: broken, cause: errUserCancel},
			status: runbox.StatusCancelled, event: runbox.EventCancelled, exit: -1, cancelled: true},
		{name: "client cancelled", x: ending{outcome: sandbox.Outcome{Cancelled: true}, cause: errUserCancel},
			status: runbox.StatusCancelled, event: runbox.EventCancelled, exit: -1, cancelled: true},
		{name: "client asked to stop", x: ending{outcome: sandbox.Outcome{Cancelled: true}, cause: errUserTerm},
			status: runbox.StatusCancelled, event: runbox.EventCancelled, exit: -1, cancelled: true},
		{name: "plain cancel", x: ending{outcome: sandbox.Outcome{Cancelled: true}, cause: context.Canceled},
			status: runbox.StatusCancelled, event: runbox.EventCancelled, exit: -1, cancelled: true},
		{name: "quota", x: ending{outcome: sandbox.Outcome{Cancelled: true}, cause: errQuota, quota: 1000},
			status: runbox.StatusError, event: runbox.EventError, exit: -1,
			message: "the conversation's files reached their quota of 1000 bytes; the program was stopped"},
		{name: "past the quota's entries, in a pod", x: ending{outcome: sandbox.Outcome{ExitCode: -1, Quota: agent.QuotaEntries}, quota: 1000, files: 20},
			status: runbox.StatusError, event: runbox.EventError, exit: -1,
			message: "the conversation's files reached their quota of 20 entries; the program was stopped, and what it changed in them was not kept"},
		{name: "past the quota's bytes, in a pod", x: ending{outcome: sandbox.Outcome{ExitCode: -1, Quota: agent.QuotaBytes}, quota: 1000, files: 20},
			status: runbox.StatusError, event: runbox.EventError, exit: -1,
			message: "the conversation's files reached their quota of 1000 bytes; the program was stopped, and what it changed in them was not kept"},
		{name: "idle", x: ending{outcome: sandbox.Outcome{Cancelled: true}, cause: errIdle, idle: "idle too long"},
			status: runbox.StatusTimedOut, event: runbox.EventTimeout, exit: -1, timedOut: true, message: "idle too long"},
		{name: "shutdown", x: ending{outcome: sandbox.Outcome{Cancelled: true}, cause: ErrShutdown},
			status: runbox.StatusError, event: runbox.EventError, exit: -1, failed: true, message: ErrShutdown.Error()},
	} {
		t.Run(tt.name, func(t *testing.T) {
			tt.x.now = now
			st := outcome(runState{result: runbox.Result{ExitCode: -1}}, tt.x)
			r := st.result
			if st.status != tt.status || r.ExitCode != tt.exit || r.Success != tt.success || r.TimedOut != tt.timedOut ||
				r.Cancelled != tt.cancelled || r.OOMKilled != tt.oom || (st.failure != nil) != tt.failed {
				t.Errorf("status %s, result %+v, failure %v", st.status, r, st.failure)
			}
			if len(st.events) != 1 {
				t.Fatalf("events %+v, want one", st.events)
			}
			ev := st.events[0]
			if ev.Type != tt.event || ev.Message != tt.message || !ev.TS.Equal(now) {
				t.Errorf("event %+v, want %s %q", ev, tt.event, tt.message)
			}
			if tt.event == runbox.EventExit && (ev.ExitCode == nil || *ev.ExitCode != tt.exit || ev.DurationMS == nil ||
				*ev.DurationMS != tt.x.outcome.Duration.Milliseconds()) {
				t.Errorf("exit event %+v", ev)
			}
			if tt.event == runbox.EventError && r.Error != tt.message {
				t.Errorf("error %q, want %q", r.Error, tt.message)
			}
			if tt.name == "exit 3" && r.Phase != "compile" {
				t.Errorf("phase %q", r.Phase)
			}
		})
	}
}
