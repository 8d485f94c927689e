package interp

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"strings"
	"time"

	"github.com/runbox-dev/runbox"
)

// executeJSON is /execute's body.
type executeJSON struct {
	Code      string            `json:"code"`
	ContextID *string           `json:"context_id"`
	Language  *string           `json:"language"`
	EnvVars   map[string]string `json:"env_vars"`
}

// output is one line of /execute's answer.
type output struct {
	Type      string `json:"type"`
	Text      string `json:"text,omitempty"`
	Timestamp string `json:"timestamp,omitempty"`
}

// execute runs a cell and streams its output as it comes.
func (in *Interpreter) execute(w http.ResponseWriter, r *http.Request, sb runbox.E2BSandbox) {
	var body executeJSON
	if err := json.NewDecoder(r.Body).Decode(&body); err != nil {
		text(w, http.StatusBadRequest, "the body is not the JSON expected")
		return
	}
	if body.ContextID != nil && *body.ContextID != "" && body.Language != nil && *body.Language != "" {
		text(w, http.StatusBadRequest, "Only one of context_id or language can be provided")
		return
	}
	c := defaultContext
	if body.ContextID != nil && *body.ContextID != "" {
		var ok bool
		if c, ok = contextOf(sb, *body.ContextID); !ok {
			text(w, http.StatusNotFound, fmt.Sprintf("Context %s not found", clip(*body.ContextID, 64)))
			return
		}
	} else if body.Language != nil {
		c.Language = strings.ToLower(*body.Language)
	}
	runner, ok := languages[c.Language]
	if !ok {
		text(w, http.StatusBadRequest, fmt.Sprintf("language %q is not one the interpreter runs", clip(c.Language, 40)))
		return
	}
	nonce := strings.ToLower(rand.Text())
	// The sandbox's variables, then the execution's on top of them.
	env := maps.Clone(sb.EnvVars)
	if env == nil {
		env = map[string]string{}
	}
	maps.Copy(env, body.EnvVars)
	body.EnvVars = env
	spec := runbox.Spec{Language: runner, Code: body.Code, ConversationID: sb.ID, Env: env}
	switch runner {
	case "python":
		spec = cellSpec(sb.ID, c, body, nonce)
	case "shell":
		// In the context's directory, named as the client knows it.
		spec.Code = "cd " + shellQuote(c.Cwd) + " 2>/dev/null\n" + body.Code
	}
	run, err := in.runs.Submit(r.Context(), spec, "")
	if err != nil {
		fail(w, err)
		return
	}
	in.stream(w, r, run, nonce, runner == "python")
}

// cellSpec is the kept-state run of a Python cell: the helper (cell.py)
// defined, then called with the cell's source and settings.
func cellSpec(conv string, c runbox.E2BContext, body executeJSON, nonce string) runbox.Spec {
	env := body.EnvVars
	if env == nil {
		env = map[string]string{}
	}
	args, _ := json.Marshal([]any{body.Code, c.ID, env, c.Cwd, nonce})
	code := cellHelper + "\n__runbox_e2b_cell(*__import__('json').loads(" + pyString(string(args)) + "))\n"
	return runbox.Spec{Language: "python", KeepState: true, Code: code, ConversationID: conv}
}

// shellQuote quotes s for bash.
func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

// pyString writes s as a Python string literal (JSON's escapes are
// Python's, but for a few JSON never makes).
func pyString(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}

// stream follows run, writing its output as lines: stdout (less the
// cell's marked lines, which become results, errors and counts), stderr,
// then the end. A caller that goes ends the run (a cell is interrupted).
func (in *Interpreter) stream(w http.ResponseWriter, r *http.Request, run runbox.Run, nonce string, cell bool) {
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	enc := json.NewEncoder(w)
	write := func(v any) {
		_ = enc.Encode(v)
		_ = rc.Flush()
	}
	demux := &demuxer{marker: []byte("\x1eRBX" + nonce + ":"), stdout: func(s string) {
		write(output{Type: "stdout", Text: s, Timestamp: time.Now().UTC().Format(time.RFC3339Nano)})
	}, marked: func(line []byte) {
		var v map[string]any
		if json.Unmarshal(line, &v) == nil {
			write(v)
		}
	}}
	if !cell {
		demux.marker = nil
	}
	stop := context.AfterFunc(r.Context(), func() {
		if _, err := in.runs.Cancel(context.WithoutCancel(r.Context()), run.ID); err != nil && !errors.Is(err, runbox.ErrRunNotFound) {
			in.log.Warn("stop a cell whose caller went", "run", run.ID, "err", err)
		}
	})
	defer stop()
	res, err := in.runs.Follow(r.Context(), run, func(ev runbox.Event) {
		switch ev.Type {
		case runbox.EventStdout:
			demux.feed([]byte(ev.Data))
		case runbox.EventStderr:
			write(output{Type: "stderr", Text: ev.Data, Timestamp: ev.TS.UTC().Format(time.RFC3339Nano)})
		}
	})
	demux.flush()
	if err != nil {
		return // the caller went, or the service failed: the answer ends short
	}
	if res.Cancelled && r.Context().Err() == nil {
		// Not this caller's doing: the sandbox was killed (or its run
		// cancelled) under it. The answer is cut, as a dropped connection,
		// which E2B's SDKs read as the sandbox's end.
		panic(http.ErrAbortHandler)
	}
	if msg := failure(res, cell); msg != nil {
		write(msg)
	}
	write(output{Type: "end_of_execution"})
}

// failure is the error line of a run that ended otherwise than a cell
// does: timed out, cancelled, out of memory, failed by the service, or
// (another language) exited non-zero.
func failure(res *runbox.Result, cell bool) map[string]any {
	switch {
	case res == nil:
		return nil
	case res.TimedOut:
		return errorLine("TimeoutError", "the execution ran past its time limit", "")
	case res.OOMKilled:
		return errorLine("MemoryError", "the sandbox ran out of memory", "")
	case res.Cancelled:
		return errorLine("KeyboardInterrupt", "the execution was cancelled", "")
	case res.Error != "":
		return errorLine("RunboxError", res.Error, "")
	case !cell && res.ExitCode != 0:
		return errorLine("ExitError", fmt.Sprintf("the program exited with code %d", res.ExitCode), res.Stderr)
	case cell && res.StateLost:
		return errorLine("StateLost", "the kept interpreter's earlier state was lost", "")
	}
	return nil
}

func errorLine(name, value, tb string) map[string]any {
	return map[string]any{"type": "error", "name": name, "value": value, "traceback": tb}
}

// demuxer splits a cell's stdout into its own output and the cell's
// marked lines, as the chunks come: a marker may be cut across chunks.
type demuxer struct {
	marker  []byte // nil: nothing is marked
	stdout  func(string)
	marked  func([]byte)
	pending []byte // bytes that may begin a marker, or a marked line not yet ended
	inLine  bool   // pending is a marked line
}

func (d *demuxer) feed(p []byte) {
	if d.marker == nil {
		d.stdout(string(p))
		return
	}
	buf := append(d.pending, p...)
	d.pending = nil
	var out bytes.Buffer
	for len(buf) > 0 {
		if d.inLine {
			end := bytes.IndexByte(buf, '\n')
			if end < 0 {
				d.pending = append(d.pending[:0], buf...)
				break
			}
			d.marked(buf[:end])
			d.inLine, buf = false, buf[end+1:]
			continue
		}
		at := bytes.Index(buf, d.marker)
		if at >= 0 {
			// What came before the marked line goes first.
			out.Write(buf[:at])
			if out.Len() > 0 {
				d.stdout(out.String())
				out.Reset()
			}
			d.inLine, buf = true, buf[at+len(d.marker):]
			continue
		}
		keep := partialSuffix(buf, d.marker)
		out.Write(buf[:len(buf)-keep])
		d.pending = append(d.pending[:0], buf[len(buf)-keep:]...)
		break
	}
	if out.Len() > 0 {
		d.stdout(out.String())
	}
}

// flush hands on what is left once the stream ended.
func (d *demuxer) flush() {
	if len(d.pending) > 0 && !d.inLine {
		d.stdout(string(d.pending))
	}
	d.pending = nil
}

// partialSuffix is the length of buf's longest end that begins marker.
func partialSuffix(buf, marker []byte) int {
	for n := min(len(buf), len(marker)-1); n > 0; n-- {
		if bytes.HasSuffix(buf, marker[:n]) {
			return n
		}
	}
	return 0
}
