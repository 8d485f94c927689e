package api

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"slices"

	"github.com/runbox-dev/runbox/internal/sessions"
)

// sessionHeader is Streamable HTTP's session id header.
const sessionHeader = "Mcp-Session-Id"

// withSessions gives MCP calls over Streamable HTTP their session. The
// SDK serves every call statelessly, so that any api replica answers any
// call; the sessions are runbox's own, kept in Redis (internal/sessions):
// an initialize (or server/discover) without a session id opens one and
// answers its id, a
// call with one finds it (404 once it ended, as the transport asks, so
// that the client starts a new one), DELETE ends it. A call without a
// session id is in its client's sessionless scope.
func (s *Server) withSessions(h http.Handler) http.Handler {
	ss := s.opts.Sessions
	if ss == nil {
		return h
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx := r.Context()
		id := r.Header.Get(sessionHeader)
		ref := sessions.Ref{Client: sessions.Client(ctx), ID: id}
		switch {
		case r.Method == http.MethodDelete:
			if id == "" {
				http.Error(w, "Bad Request: DELETE requires an Mcp-Session-Id header", http.StatusBadRequest)
				return
			}
			ok := false
			if sessions.ValidID(id) {
				var err error
				if ok, err = ss.End(ctx, ref); err != nil {
					s.log.Error("end a session", "err", err)
					http.Error(w, "the session could not be ended; try again", http.StatusServiceUnavailable)
					return
				}
			}
			if !ok {
				http.Error(w, "session not found", http.StatusNotFound)
				return
			}
			w.WriteHeader(http.StatusNoContent)
			return
		case id != "":
			ok, err := ss.Touch(ctx, ref)
			if err != nil {
				s.log.Error("look a session up", "err", err)
				http.Error(w, "the session could not be looked up; try again", http.StatusServiceUnavailable)
				return
			}
			if !ok {
				http.Error(w, "session not found", http.StatusNotFound)
				return
			}
		case r.Method == http.MethodPost:
			body, err := io.ReadAll(io.LimitReader(r.Body, s.opts.MaxBody+1))
			if err != nil {
				http.Error(w, "could not read the request", http.StatusBadRequest)
				return
			}
			r.Body = io.NopCloser(bytes.NewReader(body))
			if opens(body) {
				if ref, err = ss.Open(ctx); err != nil {
					s.log.Error("open a session", "err", err)
					http.Error(w, "no session could be opened; try again", http.StatusServiceUnavailable)
					return
				}
				w.Header().Set(sessionHeader, ref.ID)
			}
		}
		h.ServeHTTP(w, r.WithContext(sessions.With(ctx, ref)))
	})
}

// opens reports whether a JSON-RPC message (or batch) starts a
// client's connection: initialize, or server/discover, which clients of
// the sessionless protocol (2026-07-28) send instead and whose answer's
// session id they keep as well.
func opens(body []byte) bool {
	if !bytes.Contains(body, []byte(`"initialize"`)) && !bytes.Contains(body, []byte(`"server/discover"`)) {
		return false
	}
	type message struct {
		Method string `json:"method"`
	}
	opening := func(m message) bool { return m.Method == "initialize" || m.Method == "server/discover" }
	var one message
	if json.Unmarshal(body, &one) == nil {
		return opening(one)
	}
	var batch []message
	if json.Unmarshal(body, &batch) == nil {
		return slices.ContainsFunc(batch, opening)
	}
	return false
}
