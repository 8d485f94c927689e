package api

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"path"
	"strconv"
	"strings"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/runbox-dev/runbox"
	"github.com/runbox-dev/runbox/internal/conversations"
	"github.com/runbox-dev/runbox/internal/files"
	"github.com/runbox-dev/runbox/internal/runs"
)

// maxRunBody bounds POST /v1/runs: code and stdin with JSON overhead.
const maxRunBody = 8 << 20

// sseKeepAlive is how often an idle event stream gets a comment, so that
// proxies keep it open.
const sseKeepAlive = 15 * time.Second

func decodeJSON(c echo.Context, limit int64, v any) error {
	body := http.MaxBytesReader(c.Response(), c.Request().Body, limit)
	dec := json.NewDecoder(body)
	if err := dec.Decode(v); err != nil {
		if _, ok := errors.AsType[*http.MaxBytesError](err); ok {
			return runbox.Errorf(runbox.ETooLarge, "request body is larger than %d bytes", limit)
		}
		return runbox.Errorf(runbox.EInvalid, "request body is not valid JSON for this call")
	}
	if dec.More() {
		return runbox.Errorf(runbox.EInvalid, "request body holds more than one JSON value")
	}
	return nil
}

// runAccepted is the answer to an asynchronous POST /v1/runs.
type runAccepted struct {
	RunID          string        `json:"run_id"`
	Status         runbox.Status `json:"status"`
	ConversationID string        `json:"conversationId"`
	EventsURL      string        `json:"events_url" jsonschema:"the path of the run's event stream"`
}

// createRunParams are the parameters of POST /v1/runs.
type createRunParams struct {
	Wait           bool   `query:"wait" jsonschema:"answer when the run is done, with its Result (a background run: with its Run, once its program has started)"`
	IdempotencyKey string `header:"Idempotency-Key" jsonschema:"as the body's idempotency_key, which wins when both are given"`
}

func (s *Server) createRun(c echo.Context) error {
	var p createRunParams
	if err := bind(c, &p); err != nil {
		return err
	}
	var req runs.StartRequest
	if err := decodeJSON(c, maxRunBody, &req); err != nil {
		return err
	}
	ctx := c.Request().Context()
	run, err := s.opts.Runs.Submit(ctx, req.Spec(), cmp.Or(req.IdempotencyKey, p.IdempotencyKey))
	if err != nil {
		return err
	}
	c.Set(auditRunID, run.ID)
	if p.Wait && req.Background {
		// A server runs on: the answer comes once it has started.
		run, err := s.opts.Runs.WaitDetached(ctx, run.ID)
		if err != nil {
			return err
		}
		return c.JSON(http.StatusOK, run)
	}
	if p.Wait {
		res, err := s.opts.Runs.Follow(ctx, run, nil)
		if err != nil {
			return err
		}
		return c.JSON(http.StatusOK, res)
	}
	return c.JSON(http.StatusAccepted, runAccepted{
		RunID: run.ID, Status: run.Status, ConversationID: run.ConversationID,
		EventsURL: "/v1/runs/" + run.ID + "/events",
	})
}

// runParams name a run.
type runParams struct {
	ID string `path:"id" jsonschema:"the run's run_id"`
}

func (s *Server) getRun(c echo.Context) error {
	var p runParams
	if err := bind(c, &p); err != nil {
		return err
	}
	run, err := s.opts.Runs.Get(c.Request().Context(), p.ID)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, run)
}

// listRunsParams are the parameters of GET /v1/runs.
type listRunsParams struct {
	ConversationID string `query:"conversationId" jsonschema:"only this conversation's runs"`
	SessionID      string `query:"session_id" jsonschema:"another name for conversationId"`
}

// runList is the answer of GET /v1/runs: the caller's recent runs, newest
// first.
type runList struct {
	Runs []runbox.Run `json:"runs"`
}

func (s *Server) listRuns(c echo.Context) error {
	var p listRunsParams
	if err := bind(c, &p); err != nil {
		return err
	}
	list, err := s.opts.Runs.List(c.Request().Context(), cmp.Or(p.ConversationID, p.SessionID))
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, runList{Runs: list})
}

// runCancelled is the answer of DELETE /v1/runs/{id}.
type runCancelled struct {
	RunID  string        `json:"run_id"`
	Status runbox.Status `json:"status" jsonschema:"the run's status once the cancel was asked: cancelled, or how it had already ended"`
}

func (s *Server) cancelRun(c echo.Context) error {
	var p runParams
	if err := bind(c, &p); err != nil {
		return err
	}
	st, err := s.opts.Runs.Cancel(c.Request().Context(), p.ID)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, runCancelled{RunID: p.ID, Status: st})
}

// stdinBody is the body of POST /v1/runs/{id}/stdin.
type stdinBody struct {
	Data string `json:"data,omitempty" jsonschema:"text for the program's standard input"`
	EOF  bool   `json:"eof,omitempty" jsonschema:"close the program's standard input after data"`
}

// okReply is the answer of a request that has nothing more to say.
type okReply struct {
	OK bool `json:"ok"`
}

func (s *Server) sendStdin(c echo.Context) error {
	var p runParams
	if err := bind(c, &p); err != nil {
		return err
	}
	var b stdinBody
	if err := decodeJSON(c, maxRunBody, &b); err != nil {
		return err
	}
	if err := s.opts.Runs.SendStdin(c.Request().Context(), p.ID, b.Data, b.EOF); err != nil {
		return err
	}
	return c.JSON(http.StatusOK, okReply{OK: true})
}

// runnerList is the answer of GET /v1/runners.
type runnerList struct {
	Languages []runbox.Runner `json:"languages"`
}

func (s *Server) listRunners(c echo.Context) error {
	runners, err := s.opts.Runs.Runners(c.Request().Context())
	if err != nil {
		return err
	}
	if runners == nil {
		runners = []runbox.Runner{}
	}
	return c.JSON(http.StatusOK, runnerList{Languages: runners})
}

// eventsParams are the parameters of GET /v1/runs/{id}/events.
type eventsParams struct {
	runParams
	LastEventID string `header:"Last-Event-ID" pattern:"^[0-9]+$" jsonschema:"the seq of the last event the client has: the stream resumes after it"`
	After       string `query:"after" pattern:"^[0-9]+$" jsonschema:"as Last-Event-ID, which wins when both are given"`
}

// runEvents streams a run's events as server-sent events: every event from
// the first (or after Last-Event-ID), then live ones, until done.
func (s *Server) runEvents(c echo.Context) error {
	var p eventsParams
	if err := bind(c, &p); err != nil {
		return err
	}
	after := int64(0)
	if v := cmp.Or(p.LastEventID, p.After); v != "" {
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 0 {
			return runbox.Errorf(runbox.EInvalid, "Last-Event-ID must be an event's seq")
		}
		after = n
	}
	ctx, cancel := context.WithCancel(c.Request().Context())
	defer cancel()
	stop := context.AfterFunc(s.closing, cancel)
	defer stop()

	w, err := s.opts.Runs.Watch(ctx, p.ID, after)
	if err != nil {
		return err
	}
	defer w.Close()

	res := c.Response()
	h := res.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	h.Set("X-Accel-Buffering", "no")
	res.WriteHeader(http.StatusOK)
	res.Flush()
	for {
		next, cancelNext := context.WithTimeout(ctx, sseKeepAlive)
		ev, err := w.Next(next)
		cancelNext()
		switch {
		case errors.Is(err, io.EOF):
			return nil
		case errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil:
			if _, err := io.WriteString(res, ": keep-alive\n\n"); err != nil {
				return nil
			}
			res.Flush()
			continue
		case err != nil:
			return nil // the client left, or the server is shutting down
		}
		b, err := json.Marshal(ev)
		if err != nil {
			return err
		}
		if _, err := fmt.Fprintf(res, "id: %d\nevent: %s\ndata: %s\n\n", ev.Seq, ev.Type, b); err != nil {
			return nil
		}
		res.Flush()
	}
}

// downloadParams are the parameters of a signed download URL.
type downloadParams struct {
	// Path is read from the escaped path, as the signature covers it.
	Path string `path:"path" jsonschema:"[~<client>/]<conversationId>/<the file's path under /data>, each segment escaped"`
	Exp  string `query:"exp" required:"true" pattern:"^[0-9]+$" jsonschema:"when the link expires, in Unix seconds"`
	Sig  string `query:"sig" required:"true" jsonschema:"the link's signature: hex HMAC-SHA256 of the path and exp"`
}

// download serves a file by its signed URL. A bad or expired signature is
// 403 whether or not the file exists.
func (s *Server) download(c echo.Context) error {
	var p downloadParams
	if err := bind(c, &p); err != nil {
		return err
	}
	forbidden := echo.NewHTTPError(http.StatusForbidden, "the link is invalid or has expired")
	key, name, ok := files.ParseURLPath(strings.TrimPrefix(c.Request().URL.EscapedPath(), "/files/"))
	if !ok || !s.opts.Signer.Verify(key, name, p.Exp, p.Sig) {
		return forbidden
	}
	return s.serveFile(c, key, name)
}

// conversationParams name a conversation.
type conversationParams struct {
	CID string `path:"cid" jsonschema:"the conversation's id (conversationId)"`
}

// fileParams name a file of a conversation.
type fileParams struct {
	conversationParams
	// Name is read from the escaped path where it may hold slashes
	// (getFile): Echo's wildcard holds it escaped or not depending on the
	// request.
	Name string `path:"name" jsonschema:"the file's path under /data (a name, for an upload); each segment escaped"`
}

// getFile serves a conversation's file to a client with a token.
func (s *Server) getFile(c echo.Context) error {
	var p fileParams
	if err := bind(c, &p); err != nil {
		return err
	}
	prefix := "/v1/conversations/" + url.PathEscape(p.CID) + "/files/"
	name, err := url.PathUnescape(strings.TrimPrefix(c.Request().URL.EscapedPath(), prefix))
	if err != nil {
		return runbox.Errorf(runbox.EInvalidPath, "invalid file path")
	}
	key, err := runs.ConversationKey(c.Request().Context(), p.CID)
	if err != nil {
		return err
	}
	return s.serveFile(c, key, name)
}

// activeTypes are served as downloads, never rendered on our origin.
var activeTypes = []string{"text/html", "image/svg+xml", "application/xml", "text/xml", "text/javascript", "application/xhtml+xml"}

// serveFile serves the file name of the conversation key.
func (s *Server) serveFile(c echo.Context, key, name string) error {
	f, info, err := s.opts.Files.Open(c.Request().Context(), key, name)
	if err != nil {
		return err
	}
	defer f.Close()
	h := c.Response().Header()
	ctype := files.MimeType(name)
	h.Set("Content-Type", ctype)
	h.Set("X-Content-Type-Options", "nosniff")
	// What a sandbox wrote must not run as a page of this origin.
	h.Set("Content-Security-Policy", "sandbox; default-src 'none'")
	disposition := "inline"
	for _, t := range activeTypes {
		if strings.HasPrefix(ctype, t) {
			disposition = "attachment"
		}
	}
	h.Set("Content-Disposition", disposition+"; filename*=UTF-8''"+url.PathEscape(path.Base(name)))
	http.ServeContent(c.Response(), c.Request(), "", info.ModTime, f)
	return nil
}

// fileList is the answer of GET /v1/conversations/{cid}/files.
type fileList struct {
	Files []runbox.FileInfo `json:"files"`
}

func (s *Server) listFiles(c echo.Context) error {
	var p conversationParams
	if err := bind(c, &p); err != nil {
		return err
	}
	list, err := s.opts.Convs.List(c.Request().Context(), p.CID)
	if err != nil {
		return err
	}
	if list == nil {
		list = []runbox.FileInfo{}
	}
	return c.JSON(http.StatusOK, fileList{Files: list})
}

// uploadParams are the parameters of PUT /v1/conversations/{cid}/files/{name}.
type uploadParams struct {
	fileParams
	Overwrite bool `query:"overwrite" jsonschema:"replace a file of that name (otherwise 409 file_exists)"`
}

// uploadFile stores the request body as a file, streaming it to disk.
func (s *Server) uploadFile(c echo.Context) error {
	var p uploadParams
	if err := bind(c, &p); err != nil {
		return err
	}
	if cl := c.Request().ContentLength; cl > s.opts.Convs.Limits().MaxUpload {
		return runbox.Errorf(runbox.ETooLarge, "the file is larger than the limit of %d bytes", s.opts.Convs.Limits().MaxUpload)
	}
	up, err := s.opts.Convs.Upload(c.Request().Context(), p.CID, p.Name, c.Request().Body, p.Overwrite)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusCreated, up)
}

// statusReply is an answer that says only where something is: "ok",
// "closed".
type statusReply struct {
	Status string `json:"status"`
}

func (s *Server) closeConversation(c echo.Context) error {
	var p conversationParams
	if err := bind(c, &p); err != nil {
		return err
	}
	if err := s.opts.Convs.Close(c.Request().Context(), p.CID); err != nil {
		return err
	}
	return c.JSON(http.StatusOK, statusReply{Status: "closed"})
}

// forkBody is the body of POST /v1/conversations/{cid}/fork.
type forkBody struct {
	NewConversationID string `json:"new_conversation_id,omitempty" jsonschema:"the fork's id, with count 1; made when omitted"`
	Count             int    `json:"count,omitempty" minimum:"1" maximum:"10" jsonschema:"how many forks to make (default 1)"`
}

// forkConversation makes forks of a conversation (as fork_conversation).
func (s *Server) forkConversation(c echo.Context) error {
	var p conversationParams
	if err := bind(c, &p); err != nil {
		return err
	}
	var b forkBody
	if c.Request().ContentLength != 0 {
		if err := decodeJSON(c, 1<<10, &b); err != nil {
			return err
		}
	}
	out, err := s.opts.Convs.Fork(c.Request().Context(), conversations.ForkRequest{
		ConversationID: p.CID, NewID: b.NewConversationID, Count: b.Count})
	if err != nil {
		return err
	}
	return c.JSON(http.StatusCreated, out)
}

// pauseConversation saves the conversation's kept state (as
// pause_session).
func (s *Server) pauseConversation(c echo.Context) error {
	return s.keptState(c, s.opts.Runs.Pause)
}

// resumeConversation brings the conversation's kept state back (as
// resume_session).
func (s *Server) resumeConversation(c echo.Context) error {
	return s.keptState(c, s.opts.Runs.Resume)
}

func (s *Server) keptState(c echo.Context, do func(context.Context, string) (runs.KeptState, error)) error {
	var p conversationParams
	if err := bind(c, &p); err != nil {
		return err
	}
	ks, err := do(c.Request().Context(), p.CID)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, ks)
}

// previewBody is the body of POST /v1/conversations/{cid}/previews.
type previewBody struct {
	Port int `json:"port" minimum:"1" maximum:"65535" jsonschema:"the port a program of the conversation listens on"`
}

// createPreview issues a preview URL for a port a program of the
// conversation listens on (as get_preview_url).
func (s *Server) createPreview(c echo.Context) error {
	var p conversationParams
	if err := bind(c, &p); err != nil {
		return err
	}
	if s.opts.Previews == nil {
		return runbox.Errorf(runbox.EUnavailable, "previews are not served here")
	}
	var b previewBody
	if err := decodeJSON(c, 1<<10, &b); err != nil {
		return err
	}
	u, err := s.opts.Previews.IssueFor(c.Request().Context(), p.CID, b.Port)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusCreated, u)
}
