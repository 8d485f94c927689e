package runs

import (
	"context"
	"errors"
	"io"
	"time"

	"github.com/runbox-dev/runbox"
)

const (
	// cancelWait bounds how long Cancel waits for a running program to
	// be killed and its run ended.
	cancelWait = 5 * time.Second
	// maxPollWait bounds get_run's long poll.
	maxPollWait = 60
	// maxPollEvents bounds the events one get_run returns; the client
	// pages on with after_seq.
	maxPollEvents = 500
	// pollGather is how long Poll waits for more events once it has one.
	pollGather = 20 * time.Millisecond
	// listLimit is how many runs List returns.
	listLimit = 50
)

// Cancel cancels a run: a queued one never starts; a running one is killed
// (with its files so far kept). It returns the run's status afterwards; a
// finished run is left as it is.
func (s *Service) Cancel(ctx context.Context, id string) (runbox.Status, error) {
	return s.cancel(ctx, id, false)
}

// Terminate is Cancel, but a running program is asked to stop first
// (SIGTERM to it and what it started) and killed only if it has not
// after runbox.TermGrace.
func (s *Service) Terminate(ctx context.Context, id string) (runbox.Status, error) {
	return s.cancel(ctx, id, true)
}

func (s *Service) cancel(ctx context.Context, id string, graceful bool) (runbox.Status, error) {
	run, err := s.get(ctx, id)
	if err != nil {
		return "", err
	}
	if run.Status == runbox.StatusQueued {
		if run.Status, err = s.endQueued(ctx, run); err != nil {
			return "", err
		}
		if run.Status == runbox.StatusCancelled {
			return run.Status, nil
		}
	}
	if run.Status.Final() {
		return run.Status, nil
	}
	if err := s.store.RequestCancel(ctx, id, graceful); err != nil {
		return "", err
	}
	wait := cancelWait
	if graceful {
		wait += runbox.TermGrace
	}
	wctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	if _, err := s.Wait(wctx, id, 0, nil); err != nil && ctx.Err() != nil {
		return "", ctx.Err()
	}
	run, err = s.store.Run(ctx, id)
	if err != nil {
		return "", err
	}
	return run.Status, nil
}

// endQueued cancels a queued run, which then never starts, and enqueues
// its conversation's next. It returns the run's status: cancelled, or
// the one it reached meanwhile (it started).
func (s *Service) endQueued(ctx context.Context, run runbox.Run) (runbox.Status, error) {
	res := &runbox.Result{RunID: run.ID, ConversationID: run.ConversationID, ExitCode: -1, Cancelled: true,
		Files: []runbox.FileInfo{}, Artifacts: []runbox.FileInfo{}}
	a, err := s.store.Finish(ctx, run.ID, runbox.Ending{
		From: []runbox.Status{runbox.StatusQueued}, Status: runbox.StatusCancelled, Result: res,
		Events: []runbox.Event{{TS: time.Now(), Type: runbox.EventCancelled}}, Conversation: run.ConversationID,
	})
	if err != nil {
		return "", err
	}
	if !a.Done {
		return a.Status, nil
	}
	if err := s.sched.Enqueue(ctx, a.Dispatch...); err != nil {
		s.log.Warn("enqueue the runs the end let go; the sweep will", "runs", a.Dispatch, "err", err)
	}
	return runbox.StatusCancelled, nil
}

// SendStdin sends input to an interactive run; eof closes its stdin.
func (s *Service) SendStdin(ctx context.Context, id, data string, eof bool) error {
	run, err := s.get(ctx, id)
	if err != nil {
		return err
	}
	switch {
	case !run.Interactive:
		return runbox.Errorf(runbox.EInvalid, "the run was not started with interactive: true")
	case run.Status.Final():
		return runbox.Errorf(runbox.EInvalid, "the run has ended")
	case len(data) > s.limits.MaxStdinBytes:
		return runbox.Errorf(runbox.ETooLarge, "data is %d bytes; the limit is %d per call", len(data), s.limits.MaxStdinBytes)
	case data == "" && !eof:
		return runbox.Errorf(runbox.EInvalid, "nothing to send: give data, eof, or both")
	}
	err = s.store.SendStdin(ctx, id, []byte(data), eof)
	if errors.Is(err, runbox.ErrInputFull) {
		return runbox.Errorf(runbox.EBusy, "the run holds %d bytes of input its program has not read yet; send more once it has", runbox.MaxQueuedStdin)
	}
	return err
}

// List returns recent runs, newest first: a conversation's, or all.
func (s *Service) List(ctx context.Context, cid string) ([]runbox.Run, error) {
	key := ""
	if cid != "" {
		var err error
		if key, err = ConversationKey(ctx, cid); err != nil {
			return nil, err
		}
	}
	// The client's runs in the conversations the caller may reach: not
	// those of its other MCP sessions.
	all, err := s.store.RunsWhere(ctx, client(ctx), key, listLimit, func(r runbox.Run) bool { return owns(ctx, r.ConversationID) })
	if err != nil {
		return nil, err
	}
	for i, r := range all {
		all[i] = public(r)
	}
	return all, nil
}

// Events returns a run's record and its whole event log (bounded: the
// executor keeps a run's output to its cap).
func (s *Service) Events(ctx context.Context, id string) (runbox.Run, []runbox.Event, error) {
	if _, err := s.get(ctx, id); err != nil {
		return runbox.Run{}, nil, err
	}
	evs, err := s.store.Events(ctx, id, 0)
	if err != nil {
		return runbox.Run{}, nil, err
	}
	// Read after the events: a run that ended meanwhile is final here,
	// and its ending is read again below.
	run, err := s.Get(ctx, id)
	if err != nil {
		return runbox.Run{}, nil, err
	}
	if run.Status.Final() && (len(evs) == 0 || evs[len(evs)-1].Type != runbox.EventDone) {
		if evs, err = s.store.Events(ctx, id, 0); err != nil {
			return runbox.Run{}, nil, err
		}
	}
	for i := range evs {
		evs[i].Result = publicResult(evs[i].Result)
	}
	return run, evs, nil
}

// Progress is a run's state and the events after a client's last.
type Progress struct {
	runbox.Run
	Events []runbox.Event `json:"events"`
	// LastSeq is the seq of the last event returned (or the client's
	// after_seq when none): pass it as after_seq to page on.
	LastSeq int64 `json:"last_seq"`
}

// Poll returns a run's events after seq after. With wait > 0 it waits up
// to wait seconds for at least one, then returns what has come.
func (s *Service) Poll(ctx context.Context, id string, after int64, wait int) (Progress, error) {
	if after < 0 || wait < 0 || wait > maxPollWait {
		return Progress{}, runbox.Errorf(runbox.EInvalid, "after_seq must be ≥ 0 and wait_seconds between 0 and %d", maxPollWait)
	}
	w, err := s.Watch(ctx, id, after)
	if err != nil {
		return Progress{}, err
	}
	defer w.Close()
	p := Progress{Events: []runbox.Event{}, LastSeq: after}
	// Block for the first event only; take the rest that are there.
	first, cancel := context.WithTimeout(ctx, max(time.Duration(wait)*time.Second, pollGather))
	defer cancel()
	next := first
	for len(p.Events) < maxPollEvents {
		ev, err := w.Next(next)
		if errors.Is(err, io.EOF) || (err != nil && ctx.Err() == nil) {
			break
		}
		if err != nil {
			return Progress{}, err
		}
		p.Events = append(p.Events, ev)
		p.LastSeq = ev.Seq
		if next == first {
			var stop context.CancelFunc
			next, stop = context.WithTimeout(ctx, pollGather)
			defer stop()
		}
	}
	run, err := s.Get(ctx, id)
	if err != nil {
		return Progress{}, err
	}
	if !run.Status.Final() {
		run.Result = nil
	}
	p.Run = run
	return p, nil
}
