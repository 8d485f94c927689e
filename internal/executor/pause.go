package executor

import (
	"time"

	"github.com/runbox-dev/runbox"
)

// pause runs a pause (runbox.Spec.Pause): the conversation's kept
// interpreter, if one idles here, has its state saved and its sandbox
// go. It comes here as the conversation's runs do, to the executor that
// holds its sandbox.
func (e *Executor) pause(spec runbox.Spec, st runState) runState {
	begin := time.Now()
	p, err := e.sandboxes.Pause(spec.ConversationID)
	if err != nil {
		return st.fail(err, "the kept state could not be saved", time.Now())
	}
	st.result.Success, st.result.ExitCode = true, 0
	st.result.StatePaused, st.result.StateBytes, st.result.LostVariables = p.Paused, p.Size, p.Lost
	st.result.DurationMS = time.Since(begin).Milliseconds()
	st.status = runbox.StatusSucceeded
	code, ms := 0, st.result.DurationMS
	st.events = append(st.events, runbox.Event{TS: time.Now(), Type: runbox.EventExit, ExitCode: &code, DurationMS: &ms})
	return st
}
