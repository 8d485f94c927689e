package conversations

import (
	"context"
	"errors"
	"fmt"

	"github.com/runbox-dev/runbox"
	"github.com/runbox-dev/runbox/internal/runs"
	"github.com/runbox-dev/runbox/internal/snapshot"
)

// MaxForks bounds the forks one call makes.
const MaxForks = 10

// ForkRequest asks for copies of a conversation.
type ForkRequest struct {
	ConversationID string
	// NewID names the fork (Count 1 only); made when empty.
	NewID string
	// Count is how many forks, 1 to MaxForks; 0 is 1.
	Count int
}

// Forks is fork_conversation's result.
type Forks struct {
	Conversations []Fork `json:"conversations" jsonschema:"the new conversations, each a copy of the source"`
	ForkedFrom    string `json:"forked_from" jsonschema:"the conversation copied"`
	Files         int    `json:"files" jsonschema:"the files each fork holds (installed packages included)"`
	SizeBytes     int64  `json:"size_bytes" jsonschema:"their bytes, in each fork; each counts against the client's storage"`
	// PackagesForked is false where the file store does not hold installed
	// packages (FILE_STORE=s3: they stay in executors' working copies).
	PackagesForked bool   `json:"packages_forked" jsonschema:"the source's installed packages were copied"`
	StateForked    bool   `json:"state_forked" jsonschema:"the kept-state interpreter's variables were copied"`
	Note           string `json:"note,omitempty" jsonschema:"what a fork does not carry"`
}

// Fork is one new conversation.
type Fork struct {
	ConversationID string `json:"conversationId"`
}

// StateForker copies conversations' saved kept state (snapshot.Keeper).
type StateForker interface {
	// Saved reports whether the conversation's last kept interpreter has
	// its state saved, and whether it ever had one.
	Saved(ctx context.Context, conv string) (saved, had bool, err error)
	// Fork gives the conversation to the saved state of from, sealed for
	// to, and returns its bytes; snapshot.ErrNoSnapshot when from has
	// none.
	Fork(ctx context.Context, from, to string) (int64, error)
}

// Notes on what forks leave behind.
const (
	noteState = "No kept state (keep_state variables) was copied: the source had none saved; a kept-state cell in a fork starts a new interpreter."
	// With FILE_STORE=s3, installed packages live in executors' working
	// copies only.
	notePackages = " Installed packages are not in this server's file store: a run in a fork installs those it asks for again."
)

// Fork makes new conversations of the caller, each with a copy of the
// files (and installed packages) of its conversation req.ConversationID.
//
// A conversation is forked at rest: one with a run queued or running is
// busy, and so is one that a run or an upload changed while it was being
// copied (the copy is then removed): what a fork holds is what the source
// held between two runs. The forks are refused before anything is copied
// when an id is taken, or when they would take the client past its
// storage or new conversations an hour. They are copied from the first
// fork, so that all hold the same.
//
// A source whose kept interpreter may be running is paused first (as
// pause_session does), so that the forks get its state as it is now:
// each fork's first kept-state cell restores it, as does the source's
// next one.
func (s *Service) Fork(ctx context.Context, req ForkRequest) (Forks, error) {
	src, keys, err := s.forkKeys(ctx, req)
	if err != nil {
		return Forks{}, err
	}
	before, err := s.forkable(ctx, src)
	if err != nil {
		return Forks{}, err
	}
	paused, err := s.saveState(ctx, req.ConversationID, src)
	if err != nil {
		return Forks{}, err
	}
	if paused {
		// The pause was a run of the source's: it is at rest as it left it.
		if before, err = s.forkable(ctx, src); err != nil {
			return Forks{}, err
		}
	}
	if err := s.admitForks(ctx, src, keys); err != nil {
		return Forks{}, err
	}
	done, made, err := s.copyForks(ctx, src, keys)
	if err == nil {
		err = s.unchanged(ctx, src, before)
	}
	if err != nil {
		return Forks{}, errors.Join(err, s.undoForks(ctx, keys, made))
	}
	out := Forks{ForkedFrom: req.ConversationID, Files: done.Files, SizeBytes: done.Bytes + done.stateBytes,
		PackagesForked: done.Packages, StateForked: done.stateBytes > 0}
	if !out.StateForked {
		out.Note = noteState
	}
	if !done.Packages {
		out.Note += notePackages
	}
	for _, k := range keys {
		_, id, _ := runbox.ParseConversationKey(k)
		out.Conversations = append(out.Conversations, Fork{ConversationID: id})
	}
	return out, nil
}

// forkKeys checks a request and returns the keys of the source and of the
// forks.
func (s *Service) forkKeys(ctx context.Context, req ForkRequest) (string, []string, error) {
	count := req.Count
	switch {
	case count == 0:
		count = 1
	case count < 1 || count > MaxForks:
		return "", nil, runbox.Errorf(runbox.EInvalid, "count must be 1 to %d", MaxForks)
	}
	if req.NewID != "" && count > 1 {
		return "", nil, runbox.Errorf(runbox.EInvalid, "new_conversation_id names one fork: leave it out with count > 1")
	}
	src, err := runs.ConversationKey(ctx, req.ConversationID)
	if err != nil {
		return "", nil, err
	}
	keys := make([]string, count)
	for i := range keys {
		id := req.NewID
		if id == "" {
			id = runs.NewConversationID()
		}
		if keys[i], err = runs.ConversationKey(ctx, id); err != nil {
			return "", nil, fmt.Errorf("new_conversation_id: %w", err)
		}
		if keys[i] == src {
			return "", nil, runbox.Errorf(runbox.EConversationExists, "a conversation cannot be forked onto itself")
		}
	}
	return src, keys, nil
}

// forkable returns the source's mark when it can be forked: it exists (has
// been used, or has files), and no run of it is queued or running. A
// conversation of another client is not told from one never made.
func (s *Service) forkable(ctx context.Context, src string) (runbox.Mark, error) {
	m, err := s.store.Mark(ctx, src)
	if err != nil {
		return runbox.Mark{}, err
	}
	if !m.Known {
		has, err := s.files.Exists(ctx, src)
		if err != nil {
			return runbox.Mark{}, err
		}
		if !has {
			_, id, _ := runbox.ParseConversationKey(src)
			return runbox.Mark{}, runbox.Errorf(runbox.ENotFound, "no conversation %s: it was never used or is closed", id)
		}
	}
	if m.Busy {
		return runbox.Mark{}, errBusy
	}
	return m, nil
}

var errBusy = runbox.Errorf(runbox.EBusy,
	"the conversation has a run queued or running, or had one while it was being copied; fork it once its runs have ended")

// admitForks refuses forks whose ids are taken, that would start past a
// conversation's quota, or that would take the client past its tier, and
// then claims their ids.
func (s *Service) admitForks(ctx context.Context, src string, keys []string) error {
	for _, k := range keys {
		if err := s.free(ctx, k); err != nil {
			return err
		}
	}
	used, err := s.files.Usage(ctx, src)
	if err != nil {
		return err
	}
	// Each fork holds what the source does, as the store counts it (a
	// sparse file for its whole size where holes are not kept): one that
	// would start past its quota is not made. The store checks again as
	// it copies, before writing anything.
	if q := s.limits.Quota; q > 0 && used > q {
		return runbox.Errorf(runbox.EQuotaExceeded,
			"the conversation's files take %d bytes, more than a conversation's quota of %d: a fork could not hold them; delete some first",
			used, q)
	}
	if err := s.runs.AdmitForks(ctx, keys, used*int64(len(keys))); err != nil {
		return err
	}
	taken, err := s.store.ClaimConversations(ctx, keys, s.store.Retention())
	if err != nil {
		return err
	}
	if taken != "" {
		return exists(taken)
	}
	return nil
}

// free checks that the conversation key is no conversation yet.
func (s *Service) free(ctx context.Context, key string) error {
	m, err := s.store.Mark(ctx, key)
	if err != nil {
		return err
	}
	has := m.Known
	if !has {
		if has, err = s.files.Exists(ctx, key); err != nil {
			return err
		}
	}
	if has {
		return exists(key)
	}
	return nil
}

func exists(key string) error {
	_, id, _ := runbox.ParseConversationKey(key)
	return runbox.Errorf(runbox.EConversationExists, "conversation %s exists already; name the fork otherwise, or leave new_conversation_id out", id)
}

// saveState saves the source's kept interpreter if one may be running,
// and reports whether it did: it pauses the source (as pause_session,
// a run of the source's), whose sandbox goes, and whose next kept-state
// cell restores the state saved. Forking from the last state saved
// instead would give forks an older one, or none.
func (s *Service) saveState(ctx context.Context, cid, src string) (bool, error) {
	if s.state == nil {
		return false, nil
	}
	saved, had, err := s.state.Saved(ctx, src)
	if err != nil || saved || !had {
		return false, err
	}
	if _, err := s.runs.Pause(ctx, cid); err != nil {
		return false, fmt.Errorf("save the kept state to fork: %w", err)
	}
	return true, nil
}

// forked is what each fork holds.
type forked struct {
	runbox.Forked
	stateBytes int64
}

// copyForks copies the source into the first fork, and that into the
// others; it returns what each holds, and the forks it made.
func (s *Service) copyForks(ctx context.Context, src string, keys []string) (forked, []string, error) {
	var out forked
	from := src
	for i, k := range keys {
		done, err := s.files.Fork(ctx, from, k)
		if err != nil {
			return forked{}, keys[:i], err
		}
		state, err := s.forkState(ctx, src, k)
		if err != nil {
			return forked{}, keys[:i+1], err
		}
		if i == 0 {
			out, from = forked{Forked: done, stateBytes: state}, k
		}
	}
	return out, keys, nil
}

// forkState gives the fork the source's saved kept state, re-sealed for
// the fork, and returns its bytes: 0 when the source has none.
func (s *Service) forkState(ctx context.Context, src, dst string) (int64, error) {
	if s.state == nil {
		return 0, nil
	}
	n, err := s.state.Fork(ctx, src, dst)
	if errors.Is(err, snapshot.ErrNoSnapshot) {
		return 0, nil
	}
	return n, err
}

// unchanged checks that the source is as it was before the copy began.
func (s *Service) unchanged(ctx context.Context, src string, before runbox.Mark) error {
	after, err := s.store.Mark(ctx, src)
	if err != nil {
		return err
	}
	if after.Busy || after.LastRun != before.LastRun || after.Files != before.Files {
		return errBusy
	}
	return nil
}

// undoForks removes the forks made, and frees the ids claimed; a fork
// that failed removed what it had copied itself (and a conversation made
// under its id meanwhile is not the fork's to remove).
func (s *Service) undoForks(ctx context.Context, keys, made []string) error {
	ctx = context.WithoutCancel(ctx) // the request may be gone: the cleanup is not
	var errs []error
	for _, k := range made {
		errs = append(errs, s.files.Remove(ctx, k))
	}
	errs = append(errs, s.store.ReleaseConversations(ctx, keys))
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("undo forks: %w", err)
	}
	return nil
}
