package egress

import (
	"bufio"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"strings"
)

// hopByHop are the headers of one connection, never forwarded.
var hopByHop = []string{"Connection", "Proxy-Connection", "Keep-Alive", "Proxy-Authenticate", "Proxy-Authorization",
	"Te", "Trailer", "Transfer-Encoding", "Upgrade"}

func removeHopByHop(h http.Header) {
	for _, f := range h.Values("Connection") {
		for name := range strings.SplitSeq(f, ",") {
			h.Del(strings.TrimSpace(name))
		}
	}
	for _, name := range hopByHop {
		h.Del(name)
	}
}

// forward sends a plain request on and its response back; it reports
// whether the program's connection may carry another request.
func (r *Run) forward(c net.Conn, req *http.Request, t target) bool {
	body := &trackedBody{ReadCloser: req.Body}
	out := req.Clone(httptrace.WithClientTrace(r.ctx, r.p.idleTrace()))
	out.Body, out.RequestURI, out.Host = body, "", ""
	if req.ContentLength == 0 {
		out.Body = http.NoBody
		body.eof = true
	}
	removeHopByHop(out.Header)
	// Whether the program's connection is kept is the program's say; the
	// upstream one is pooled for the run's next request, on this
	// connection or another (urllib sends "Connection: close" with every
	// request, and a new dial each cost more than the whole request).
	out.Close = false
	resp, err := r.tr.RoundTrip(out)
	if err != nil {
		var ref *refusal
		if errors.As(err, &ref) {
			writeRefusal(c, http.StatusForbidden, ref.reason)
		} else {
			writeRefusal(c, http.StatusBadGateway, "could not reach "+t.host+": "+dialError(err))
		}
		return false
	}
	removeHopByHop(resp.Header)
	keep := !req.Close && !resp.Close
	resp.Close = !keep // the program is told
	w := bufio.NewWriterSize(c, copyBuffer)
	if err := resp.Write(w); err != nil || w.Flush() != nil {
		return false
	}
	return keep && body.eof
}

// trackedBody says whether a request's body was read to its end, so that
// the next request on the connection starts where it should.
type trackedBody struct {
	io.ReadCloser
	eof bool
}

func (b *trackedBody) Read(p []byte) (int, error) {
	n, err := b.ReadCloser.Read(p)
	if errors.Is(err, io.EOF) {
		b.eof = true
	}
	return n, err
}
