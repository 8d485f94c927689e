package runs

import (
	"context"

	"github.com/runbox-dev/runbox"
)

// KeptState is what pause_session and resume_session answer.
type KeptState struct {
	ConversationID string `json:"conversationId"`
	// Paused says that a running kept interpreter's state was saved and
	// its sandbox let go; StateBytes is what the state takes in the
	// conversation's quota.
	Paused     bool  `json:"paused"`
	StateBytes int64 `json:"state_bytes,omitempty"`
	// StateRestored says that a paused state was brought back.
	StateRestored bool `json:"state_restored"`
	// LostVariables could not be kept: open sockets, threads, generators.
	LostVariables []string `json:"lost_variables,omitempty"`
	// StateLost says that there was state, and it was lost.
	StateLost bool `json:"state_lost,omitempty"`
}

// Pause has the executor that holds the conversation's kept interpreter
// save its state and let its sandbox go, and waits for that. A pause goes
// as a run does: after the conversation's runs before it, to the executor
// that holds its sandbox.
func (s *Service) Pause(ctx context.Context, cid string) (KeptState, error) {
	res, err := s.runKept(ctx, runbox.Spec{Language: "python", Code: "pass", ConversationID: cid, KeepState: true, Pause: true})
	if err != nil {
		return KeptState{}, err
	}
	return KeptState{ConversationID: res.ConversationID, Paused: res.StatePaused, StateBytes: res.StateBytes,
		LostVariables: res.LostVariables}, nil
}

// Resume brings a paused kept interpreter back now, rather than with the
// conversation's next kept-state cell: it runs an empty cell.
func (s *Service) Resume(ctx context.Context, cid string) (KeptState, error) {
	res, err := s.runKept(ctx, runbox.Spec{Language: "python", Code: "None", ConversationID: cid, KeepState: true})
	if err != nil {
		return KeptState{}, err
	}
	return KeptState{ConversationID: res.ConversationID, StateRestored: res.StateRestored,
		LostVariables: res.LostVariables, StateLost: res.StateLost}, nil
}

func (s *Service) runKept(ctx context.Context, spec runbox.Spec) (*runbox.Result, error) {
	if spec.ConversationID == "" {
		return nil, runbox.Errorf(runbox.EInvalid, "conversationId is required")
	}
	run, err := s.Submit(ctx, spec, "")
	if err != nil {
		return nil, err
	}
	res, err := s.Follow(ctx, run, nil)
	if err != nil {
		return nil, err
	}
	if res.Error != "" {
		return nil, runbox.Errorf(runbox.EInternal, "%s", res.Error)
	}
	return res, nil
}
