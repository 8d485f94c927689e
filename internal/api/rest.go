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
	EventsURL      string        `json:"events_url"`
}

func (s *Server) createRun(c echo.Context) error {
	var req runs.StartRequest
	if err := decodeJSON(c, maxRunBody, &req); err != nil {
		return err
	}
	ctx := c.Request().Context()
	run, err := s.opts.Runs.Submit(ctx, req.Spec(), cmp.Or(req.IdempotencyKey, c.Request().Header.Get("Idempotency-Key")))
	if err != nil {
		return err
	}
	c.Set(auditRunID, run.ID)
	wait, _ := strconv.ParseBool(c.QueryParam("wait"))
	if wait && req.Background {
		// A server runs on: the answer comes once it has started.
		run, err := s.opts.Runs.WaitDetached(ctx, run.ID)
		if err != nil {
			return err
		}
		return c.JSON(http.StatusOK, run)
	}
	if wait {
		res, err := s.opts.Runs.Wait(ctx, run.ID, 0, nil)
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

func (s *Server) getRun(c echo.Context) error {
	run, err := s.opts.Runs.Get(c.Request().Context(), c.Param("id"))
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, run)
}

func (s *Server) listRuns(c echo.Context) error {
	list, err := s.opts.Runs.List(c.Request().Context(), cmp.Or(c.QueryParam("conversationId"), c.QueryParam("session_id")))
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, map[string]any{"runs": list})
}

func (s *Server) cancelRun(c echo.Context) error {
	st, err := s.opts.Runs.Cancel(c.Request().Context(), c.Param("id"))
	if err != nil {
		return err
	}
	return c.JSON(http.StatusOK, map[string]any{"run_id": c.Param("id"), "status": st})
}

// stdinBody is the body of POST /v1/runs/{id}/stdin.
type stdinBody struct {
	Data string `json:"data"`
	EOF  bool   `json:"eof"`
}

func (s *Server) sendStdin(c echo.Context) error {
	var b stdinBody
	if err := decodeJSON(c, maxRunBody, &b); err != nil {
		return err
	}
	if err := s.opts.Runs.SendStdin(c.Request().Context(), c.Param("id"), b.Data, b.EOF); err != nil {
		return err
	}
	return c.JSON(http.StatusOK, map[string]bool{"ok": true})
}

func (s *Server) listRunners(c echo.Context) error {
	runners, err := s.opts.Runs.Runners(c.Request().Context())
	if err != nil {
		return err
	}
	if runners == nil {
		runners = []runbox.Runner{}
	}
	return c.JSON(http.StatusOK, map[string]any{"languages": runners})
}

// runEvents streams a run's events as server-sent events: every event from
// the first (or after Last-Event-ID), then live ones, until done.
func (s *Server) runEvents(c echo.Context) error {
	after := int64(0)
	if v := cmp.Or(c.Request().Header.Get("Last-Event-ID"), c.QueryParam("after")); v != "" {
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

	w, err := s.opts.Runs.Watch(ctx, c.Param("id"), after)
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

// download serves a file by its signed URL. A bad or expired signature is
// 403 whether or not the file exists.
func (s *Server) download(c echo.Context) error {
	forbidden := echo.NewHTTPError(http.StatusForbidden, "the link is invalid or has expired")
	key, name, ok := files.ParseURLPath(strings.TrimPrefix(c.Request().URL.EscapedPath(), "/files/"))
	if !ok || !s.opts.Signer.Verify(key, name, c.QueryParam("exp"), c.QueryParam("sig")) {
		return forbidden
	}
	return s.serveFile(c, key, name)
}

// getFile serves a conversation's file to a client with a token.
func (s *Server) getFile(c echo.Context) error {
	prefix := "/v1/conversations/" + url.PathEscape(c.Param("cid")) + "/files/"
	name, err := url.PathUnescape(strings.TrimPrefix(c.Request().URL.EscapedPath(), prefix))
	if err != nil {
		return runbox.Errorf(runbox.EInvalidPath, "invalid file path")
	}
	key, err := runs.ConversationKey(c.Request().Context(), c.Param("cid"))
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

func (s *Server) listFiles(c echo.Context) error {
	list, err := s.opts.Convs.List(c.Request().Context(), c.Param("cid"))
	if err != nil {
		return err
	}
	if list == nil {
		list = []runbox.FileInfo{}
	}
	return c.JSON(http.StatusOK, map[string]any{"files": list})
}

// uploadFile stores the request body as a file, streaming it to disk.
func (s *Server) uploadFile(c echo.Context) error {
	overwrite, _ := strconv.ParseBool(c.QueryParam("overwrite"))
	if cl := c.Request().ContentLength; cl > s.opts.Convs.Limits().MaxUpload {
		return runbox.Errorf(runbox.ETooLarge, "the file is larger than the limit of %d bytes", s.opts.Convs.Limits().MaxUpload)
	}
	up, err := s.opts.Convs.Upload(c.Request().Context(), c.Param("cid"), c.Param("name"), c.Request().Body, overwrite)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusCreated, up)
}

func (s *Server) closeConversation(c echo.Context) error {
	if err := s.opts.Convs.Close(c.Request().Context(), c.Param("cid")); err != nil {
		return err
	}
	return c.JSON(http.StatusOK, map[string]string{"status": "closed"})
}

// previewBody is the body of POST /v1/conversations/{cid}/previews.
type previewBody struct {
	Port int `json:"port"`
}

// createPreview issues a preview URL for a port a program of the
// conversation listens on (as get_preview_url).
func (s *Server) createPreview(c echo.Context) error {
	if s.opts.Previews == nil {
		return runbox.Errorf(runbox.EUnavailable, "previews are not served here")
	}
	var b previewBody
	if err := decodeJSON(c, 1<<10, &b); err != nil {
		return err
	}
	u, err := s.opts.Previews.IssueFor(c.Request().Context(), c.Param("cid"), b.Port)
	if err != nil {
		return err
	}
	return c.JSON(http.StatusCreated, u)
}
