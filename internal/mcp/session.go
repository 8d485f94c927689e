package mcp

import (
	"context"
	"crypto/rand"
	"sync"
	"time"

	mcpsdk "github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/runbox-dev/runbox/internal/sessions"
)

// endWait bounds how long the end of a session's transport waits for its
// executions to be cancelled and its folder removed.
const endWait = time.Minute

// held are the sessions whose transport this process holds (HTTP+SSE,
// stdio): each has a session id of its own, and ends when its transport
// closes. Streamable HTTP's calls come with their session set by the api
// (sessions.With), from the Mcp-Session-Id it issued.
type held struct {
	mu   sync.Mutex
	refs map[*mcpsdk.ServerSession]sessions.Ref
	// ending counts the ends under way of closed transports' sessions.
	ending sync.WaitGroup
}

// sessionScope gives every call the session it came in (sessions.From).
func (s *Server) sessionScope(next mcpsdk.MethodHandler) mcpsdk.MethodHandler {
	return func(ctx context.Context, method string, req mcpsdk.Request) (mcpsdk.Result, error) {
		if _, ok := sessions.From(ctx); !ok {
			if ss, ok := req.GetSession().(*mcpsdk.ServerSession); ok && ss != nil {
				ctx = sessions.With(ctx, s.heldRef(ctx, ss))
			}
		}
		return next(ctx, method, req)
	}
}

// heldRef returns the session of a transport this process holds, naming
// it at its first call; when the transport closes, the session ends.
func (s *Server) heldRef(ctx context.Context, ss *mcpsdk.ServerSession) sessions.Ref {
	s.held.mu.Lock()
	defer s.held.mu.Unlock()
	if ref, ok := s.held.refs[ss]; ok {
		return ref
	}
	ref := sessions.Ref{Client: sessions.Client(ctx), ID: rand.Text()}
	s.held.refs[ss] = ref
	s.held.ending.Go(func() {
		_ = ss.Wait()
		s.held.mu.Lock()
		delete(s.held.refs, ss)
		s.held.mu.Unlock()
		if s.sessions == nil {
			return
		}
		ectx, cancel := context.WithTimeout(context.WithoutCancel(s.stopping), endWait)
		defer cancel()
		if _, err := s.sessions.End(ectx, ref); err != nil {
			s.log.Warn("end the session of a closed transport", "session", ref.ID, "err", err)
		}
	})
	return ref
}

// EndHeld ends the sessions of the transports this process holds, for a
// process that stops serving them (stdio's client went away), and waits
// for every end under way, so that what a session holds is let go before
// the process closes its connections.
func (s *Server) EndHeld(ctx context.Context) {
	defer func() {
		done := make(chan struct{})
		go func() {
			s.held.ending.Wait()
			close(done)
		}()
		select {
		case <-done:
		case <-ctx.Done():
		}
	}()
	s.held.mu.Lock()
	refs := make([]sessions.Ref, 0, len(s.held.refs))
	for ss, ref := range s.held.refs {
		refs = append(refs, ref)
		delete(s.held.refs, ss)
	}
	s.held.mu.Unlock()
	if s.sessions == nil {
		return
	}
	for _, ref := range refs {
		if _, err := s.sessions.End(ctx, ref); err != nil {
			s.log.Warn("end a session", "session", ref.ID, "err", err)
		}
	}
}
