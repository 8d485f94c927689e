package egress

import (
	"bytes"
	"compress/gzip"
	"compress/zlib"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"html"
	"io"
	"net/http"
	"net/url"
	"slices"
	"strings"
)

// Scrubbing: what a server of a secret's domain answers reaches the
// program with every form of the secrets' values (forms) replaced by
// their placeholders, on every path: the final answer's headers (names
// and values), its body (its content coding undone) and trailers, and
// every message and control frame of a WebSocket (websocket.go). Interim
// answers do not reach the program at all, nor does the status line's
// reason (mitm.go). A value is found wherever it is whole in one of
// those: split across reads, chunks or a message's frames, it is still
// found; split by the server across two answers, two messages or two
// fields of a structure, or written in an encoding not among the forms,
// it is not (SECURITY.md).

// forms returns the spellings of a value a server may echo it in: as it
// is, escaped in JSON (as encoding/json and as encoders that also escape
// '/' write it), in HTML, percent-encoded (a query's, a path's), and in
// base64 (standard and URL alphabets) at each of the three offsets it
// may start at in the encoded text, less the characters at either end
// that depend on the bytes around it.
func forms(v string) []string {
	out := []string{v}
	add := func(f string) {
		if !slices.Contains(out, f) {
			out = append(out, f)
		}
	}
	for _, escapeHTML := range []bool{true, false} {
		var b bytes.Buffer
		enc := json.NewEncoder(&b)
		enc.SetEscapeHTML(escapeHTML)
		_ = enc.Encode(v)
		j := string(bytes.TrimSpace(b.Bytes()))
		add(j[1 : len(j)-1])
		add(strings.ReplaceAll(j[1:len(j)-1], "/", `\/`))
	}
	add(html.EscapeString(v))
	add(url.QueryEscape(v))
	add(url.PathEscape(v))
	for _, b64 := range []*base64.Encoding{base64.StdEncoding, base64.URLEncoding} {
		for k := range 3 {
			e := b64.EncodeToString(append(make([]byte, k), v...))
			// The characters whose six bits all come from v.
			add(e[(8*k+5)/6 : 8*(k+len(v))/6])
		}
	}
	return out
}

// redaction is what the proxy replaces in a secret domain's answers:
// each form of each secret's value, by that secret's placeholder.
type redaction struct {
	pairs []pair
	// longest is the longest form's length.
	longest int
}

type pair struct {
	form, placeholder []byte
	lower             []byte // form in lower case, for header names
}

func newRedaction(ss []Secret) *redaction {
	rd := &redaction{}
	for _, s := range ss {
		for _, f := range forms(s.Value) {
			rd.pairs = append(rd.pairs, pair{form: []byte(f), placeholder: []byte(s.Placeholder()), lower: []byte(strings.ToLower(f))})
			rd.longest = max(rd.longest, len(f))
		}
	}
	return rd
}

// replace returns b with every form replaced.
func (rd *redaction) replace(b []byte) []byte {
	s := stream{rd: rd}
	return s.next(nil, b, true)
}

// header replaces the forms in every value of h, and drops a field
// whose name holds one (compared without case, which a name does not
// keep).
func (rd *redaction) header(h http.Header) {
	for name, values := range h {
		lower := []byte(strings.ToLower(name))
		if slices.ContainsFunc(rd.pairs, func(p pair) bool { return bytes.Contains(lower, p.lower) }) {
			delete(h, name)
			continue
		}
		for i, v := range values {
			values[i] = string(rd.replace([]byte(v)))
		}
	}
}

// stream replaces the forms in bytes that come in pieces. It holds back
// no more than it must: the end of what came that could be the start of
// a form, until the next piece tells.
type stream struct {
	rd      *redaction
	pending []byte // came, not yet known (a possible start of a form)
}

// next appends to dst what is known of the bytes held back and p, forms
// replaced (the leftmost first, the longest of those starting there);
// all of it when final.
func (s *stream) next(dst, p []byte, final bool) []byte {
	data := append(s.pending, p...)
	s.pending = nil
	for {
		at, k := -1, 0
		for i, pr := range s.rd.pairs {
			if j := bytes.Index(data, pr.form); j >= 0 && (at < 0 || j < at || j == at && len(pr.form) > len(s.rd.pairs[k].form)) {
				at, k = j, i
			}
		}
		// A form that may start at or before it, and the next piece
		// complete, decides first.
		if p := s.partial(data); !final && p >= 0 && (at < 0 || p <= at) {
			s.pending = bytes.Clone(data[p:])
			return append(dst, data[:p]...)
		}
		if at < 0 {
			return append(dst, data...)
		}
		dst = append(dst, data[:at]...)
		dst = append(dst, s.rd.pairs[k].placeholder...)
		data = data[at+len(s.rd.pairs[k].form):]
	}
}

// partial returns where the longest end of data that is the start of a
// longer form begins, or -1.
func (s *stream) partial(data []byte) int {
	for l := min(len(data), s.rd.longest-1); l > 0; l-- {
		tail := data[len(data)-l:]
		for _, pr := range s.rd.pairs {
			if len(pr.form) > l && bytes.HasPrefix(pr.form, tail) {
				return len(data) - l
			}
		}
	}
	return -1
}

// scrubber reads a body with the forms replaced.
type scrubber struct {
	r   io.ReadCloser
	s   stream
	buf []byte
	out []byte // scrubbed, not yet returned
	err error
	// closed is called once the body is closed: a response's trailers
	// are read by then.
	closed func()
}

// scrubBufferSize is what one read of a scrubbed body asks for.
const scrubBufferSize = 32 << 10

func newScrubber(r io.ReadCloser, rd *redaction, closed func()) *scrubber {
	return &scrubber{r: r, s: stream{rd: rd}, buf: make([]byte, scrubBufferSize), closed: closed}
}

func (s *scrubber) Read(p []byte) (int, error) {
	for len(s.out) == 0 && s.err == nil {
		n, err := s.r.Read(s.buf)
		s.err = err
		s.out = s.s.next(s.out, s.buf[:n], err != nil)
	}
	if len(s.out) > 0 {
		n := copy(p, s.out)
		s.out = s.out[n:]
		return n, nil
	}
	return 0, s.err
}

func (s *scrubber) Close() error {
	err := s.r.Close()
	if s.closed != nil {
		s.closed()
	}
	return err
}

// unscrubbable is an answer the proxy cannot scrub, and so does not
// carry.
type unscrubbable struct{ reason string }

func (e *unscrubbable) Error() string { return e.reason }

// decoded returns resp's body with its content coding undone, or an
// unscrubbable error for a coding the proxy cannot undo: a server may
// compress though the request asked for no coding, and compressed bytes
// hide the value from matching.
func decoded(resp *http.Response) (io.ReadCloser, error) {
	var codings []string
	for _, v := range resp.Header.Values("Content-Encoding") {
		for c := range strings.SplitSeq(v, ",") {
			if c = strings.ToLower(strings.TrimSpace(c)); c != "" && c != "identity" {
				codings = append(codings, c)
			}
		}
	}
	if len(codings) == 0 {
		return resp.Body, nil
	}
	var open func(io.Reader) (io.Reader, error)
	switch {
	case len(codings) > 1:
	case codings[0] == "gzip" || codings[0] == "x-gzip":
		open = func(r io.Reader) (io.Reader, error) { return gzip.NewReader(r) }
	case codings[0] == "deflate":
		open = func(r io.Reader) (io.Reader, error) { return zlib.NewReader(r) }
	}
	if open == nil {
		return nil, &unscrubbable{fmt.Sprintf("the server's answer is in the content coding %q, which the proxy cannot undo to scrub it",
			cut(strings.Join(codings, ", ")))}
	}
	resp.Header.Del("Content-Encoding")
	resp.Uncompressed = true
	return &decoder{body: resp.Body, open: open}, nil
}

// decoder undoes a content coding as the body is read (opened on the
// first read, so that the answer's header does not wait for the body).
type decoder struct {
	body io.ReadCloser
	open func(io.Reader) (io.Reader, error)
	r    io.Reader
}

func (d *decoder) Read(p []byte) (int, error) {
	if d.r == nil {
		r, err := d.open(d.body)
		if err != nil {
			return 0, err
		}
		d.r = r
	}
	return d.r.Read(p)
}

func (d *decoder) Close() error { return d.body.Close() }
