package egress

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"unicode/utf8"

	"github.com/gobwas/ws"
)

// A WebSocket to a secret's domain is the one upgrade the proxy carries
// (mitm.go), because its framing lets the proxy scrub it: wsScrubber
// reads every frame the server sends and writes it anew for the program,
// the forms of the values replaced in each data message as one stream
// (across its frames and reads) and in each control frame. Frames may
// change length, and a message's fragmentation, which RFC 6455 lets an
// intermediary do when no extension is in use; and none is: the proxy
// takes Sec-WebSocket-Extensions off the upgrade request and refuses a
// 101 that names one, since a compressed frame (permessage-deflate)
// hides the value from matching. A frame the proxy cannot scrub — with a
// reserved bit set (an extension's), a reserved opcode, masked, out of
// sequence — ends the stream: the program gets a close frame that says
// why (1002) and nothing of that frame. What the program sends goes to
// the server as it is: it holds placeholders only.

// wsScrubber is the server's side of an upgraded WebSocket as the proxy
// carries it: reads give the program's frames, writes go to the server.
type wsScrubber struct {
	up io.ReadWriteCloser
	br *bufio.Reader
	rd *redaction
	// refused is told why a frame ended the stream.
	refused func(reason string)

	state ws.State
	msg   stream // the current data message's
	// op is the current message's opcode until its first frame is
	// out, then 0 (a continuation's).
	op   ws.OpCode
	left int64 // of the current data frame's payload, to read
	fin  bool  // the current data frame ends its message
	buf  []byte
	out  bytes.Buffer // frames for the program
	err  error
}

func newWSScrubber(up io.ReadWriteCloser, rd *redaction, refused func(string)) *wsScrubber {
	return &wsScrubber{up: up, br: bufio.NewReaderSize(up, scrubBufferSize), rd: rd, refused: refused,
		state: ws.StateClientSide, msg: stream{rd: rd}, buf: make([]byte, scrubBufferSize)}
}

// errWSEnded ends a stream the proxy could not scrub.
var errWSEnded = errors.New("a WebSocket frame the proxy cannot scrub")

func (s *wsScrubber) Read(p []byte) (int, error) {
	for s.out.Len() == 0 && s.err == nil {
		s.err = s.next()
	}
	if s.out.Len() > 0 {
		return s.out.Read(p)
	}
	return 0, s.err
}

func (s *wsScrubber) Write(p []byte) (int, error) { return s.up.Write(p) }

func (s *wsScrubber) Close() error { return s.up.Close() }

// next reads a frame's header, or the next piece of a data frame's
// payload, and writes what it can for the program.
func (s *wsScrubber) next() error {
	if s.left == 0 {
		h, err := ws.ReadHeader(s.br)
		if errors.Is(err, ws.ErrHeaderLengthMSB) || errors.Is(err, ws.ErrHeaderLengthUnexpected) {
			return s.refuse(err.Error())
		} else if err != nil {
			return err
		}
		if err := ws.CheckHeader(h, s.state); err != nil {
			return s.refuse(err.Error())
		}
		if h.OpCode.IsControl() {
			return s.control(h)
		}
		if h.OpCode != ws.OpContinuation {
			s.op = h.OpCode
		}
		s.state = s.state.Clear(ws.StateFragmented)
		if !h.Fin {
			s.state = s.state.Set(ws.StateFragmented)
		}
		s.left, s.fin = h.Length, h.Fin
		if s.left == 0 {
			s.data(nil, s.fin)
			return nil
		}
	}
	n, err := s.br.Read(s.buf[:min(int64(len(s.buf)), s.left)])
	s.left -= int64(n)
	s.data(s.buf[:n], s.left == 0 && s.fin)
	if err == io.EOF && s.left > 0 {
		err = io.ErrUnexpectedEOF
	}
	return err
}

// data passes on what of a data message's payload p is known, as a frame
// of the message; end: p ends the message.
func (s *wsScrubber) data(p []byte, end bool) {
	payload := s.msg.next(nil, p, end)
	if len(payload) == 0 && !end {
		return
	}
	op := ws.OpContinuation
	if s.op != 0 {
		op, s.op = s.op, 0
	}
	s.write(ws.Header{Fin: end, OpCode: op, Length: int64(len(payload))}, payload)
}

// control passes on a control frame, its payload scrubbed and, if that
// made it longer than a control frame may be, cut (a close frame's
// reason where it stays UTF-8).
func (s *wsScrubber) control(h ws.Header) error {
	p := make([]byte, h.Length)
	if _, err := io.ReadFull(s.br, p); err != nil {
		return err
	}
	p = s.rd.replace(p)
	if len(p) > ws.MaxControlFramePayloadSize {
		p = p[:ws.MaxControlFramePayloadSize]
		for h.OpCode == ws.OpClose && len(p) > 2 && !utf8.Valid(p[2:]) {
			p = p[:len(p)-1]
		}
	}
	s.write(ws.Header{Fin: true, OpCode: h.OpCode, Length: int64(len(p))}, p)
	return nil
}

// refuse ends the stream: the program gets a close frame that says why,
// and nothing more.
func (s *wsScrubber) refuse(why string) error {
	s.refused(why)
	reason := "runbox egress: " + why
	if len(reason) > ws.MaxControlFramePayloadSize-2 {
		reason = reason[:ws.MaxControlFramePayloadSize-2]
	}
	p := ws.NewCloseFrameBody(ws.StatusProtocolError, reason)
	s.write(ws.Header{Fin: true, OpCode: ws.OpClose, Length: int64(len(p))}, p)
	return errWSEnded
}

func (s *wsScrubber) write(h ws.Header, payload []byte) {
	_ = ws.WriteHeader(&s.out, h) // a bytes.Buffer does not fail
	s.out.Write(payload)
}
