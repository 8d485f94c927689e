package egress

import (
	"bufio"
	"bytes"
	"crypto/sha1"
	"encoding/base64"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
	"testing/iotest"

	"github.com/gobwas/ws"

	"github.com/runbox-dev/runbox"
)

// websocket is ws.secret.test: a WebSocket server that hands the secret's
// header it was sent back in every place a server can. /socket echoes it
// in the 101's reason, a header's value and a header's name, then in
// messages: whole, split across two frames, in a ping, in base64, split
// across two writes (the second once the client sent a frame), in the
// close frame. /compressed sends it in a frame marked compressed though
// no extension was agreed, /negotiates agrees to compression the client
// offered, /switches switches to another protocol than asked.
func (sf *secretFixture) websocket(w http.ResponseWriter, r *http.Request) {
	sf.seen.add(r)
	if !strings.EqualFold(r.Header.Get("Upgrade"), "websocket") {
		http.Error(w, "no upgrade", http.StatusBadRequest)
		return
	}
	auth := r.Header.Get("Authorization")
	c, brw, err := w.(http.Hijacker).Hijack()
	if err != nil {
		return
	}
	defer c.Close()
	sum := sha1.Sum([]byte(r.Header.Get("Sec-Websocket-Key") + "258EAFA5-E914-47DA-95CA-C5AB0DC85B11"))
	protocol := "websocket"
	if r.URL.Path == "/switches" {
		protocol = "test"
	}
	head := fmt.Sprintf("HTTP/1.1 101 %s\r\nConnection: Upgrade\r\nUpgrade: %s\r\nSec-WebSocket-Accept: %s\r\nX-Echo: %s\r\n%s: 1\r\n",
		auth, protocol, base64.StdEncoding.EncodeToString(sum[:]), auth, strings.TrimPrefix(auth, "Bearer "))
	if r.URL.Path == "/negotiates" {
		head += "Sec-WebSocket-Extensions: permessage-deflate\r\n"
	}
	brw.WriteString(head + "\r\n")
	send := func(f ws.Frame) { ws.WriteFrame(brw, f); brw.Flush() }
	switch r.URL.Path {
	case "/compressed":
		f := ws.NewTextFrame([]byte(auth))
		f.Header.Rsv = ws.Rsv(true, false, false)
		send(f)
		ws.ReadFrame(brw) // until the proxy ends the stream
		return
	case "/negotiates", "/switches":
		send(ws.NewTextFrame([]byte(auth)))
		return
	}
	half := len(auth) / 2
	send(ws.NewTextFrame([]byte("authorized " + auth)))
	send(ws.NewFrame(ws.OpText, false, []byte("split "+auth[:half])))
	send(ws.NewFrame(ws.OpContinuation, true, []byte(auth[half:])))
	send(ws.NewPingFrame([]byte(strings.TrimPrefix(auth, "Bearer "))))
	send(ws.NewBinaryFrame([]byte(base64.StdEncoding.EncodeToString([]byte(auth)))))
	// A frame whose payload comes in two writes, the value straddling
	// them: the second waits until the client read the first and answered.
	later := "later " + auth
	ws.WriteHeader(brw, ws.Header{Fin: true, OpCode: ws.OpText, Length: int64(len(later))})
	brw.WriteString(later[:len(later)-half])
	brw.Flush()
	if _, err := ws.ReadFrame(brw); err != nil {
		return
	}
	brw.WriteString(later[len(later)-half:])
	send(ws.NewCloseFrame(ws.NewCloseFrameBody(ws.StatusNormalClosure, auth)))
	io.Copy(io.Discard, brw) // until the client ends
}

// dialWebSocket opens a WebSocket to ws.secret.test's path as a program
// would, offering compression, and returns the proxy's answer and the
// stream that follows it.
func (sf *secretFixture) dialWebSocket(t *testing.T, path string) (*http.Response, io.Writer, *bufio.Reader) {
	t.Helper()
	tc, err := sf.tlsThrough(t, "ws.secret.test", sf.ws, "ws.secret.test")
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(tc, "GET %s HTTP/1.1\r\nHost: ws.secret.test:%d\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n"+
		"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n"+
		"Sec-WebSocket-Extensions: permessage-deflate; client_max_window_bits\r\nAuthorization: Bearer %s\r\n\r\n",
		path, sf.ws, Placeholder("svc"))
	br := bufio.NewReader(tc)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatal(err)
	}
	return resp, tc, br
}

// leaks reports whether b holds the test's value, literally or in base64
// (at any of the three offsets, less the ends the neighbours change).
func leaks(b []byte) bool {
	if bytes.Contains(b, []byte(testValue)) {
		return true
	}
	for _, enc := range []*base64.Encoding{base64.StdEncoding, base64.URLEncoding} {
		for pad := range 3 {
			e := enc.EncodeToString([]byte(strings.Repeat("x", pad) + testValue))
			if bytes.Contains(b, []byte(e[4:len(e)-4])) {
				return true
			}
		}
	}
	return false
}

func TestSecretsWebSocket(t *testing.T) {
	sf := newSecretFixture(t)
	ph := Placeholder("svc")

	t.Run("echoes", func(t *testing.T) {
		r := sf.openSecrets(t, []string{"svc"}, "ws.secret.test")
		defer r.Close()
		resp, w, br := sf.dialWebSocket(t, "/socket")
		got := sf.seen.last(t)
		if got.Header.Get("Authorization") != "Bearer "+testValue || got.Header.Get("Sec-Websocket-Extensions") != "" {
			t.Errorf("the server was sent %v", got.Header)
		}
		var head bytes.Buffer
		resp.Write(&head)
		if resp.StatusCode != http.StatusSwitchingProtocols || leaks(head.Bytes()) || resp.Header.Get("X-Echo") != "Bearer "+ph {
			t.Fatalf("the answer to the upgrade: %s", head.Bytes())
		}
		// What the program reads: each message whole, control frames
		// apart, the close frame's reason.
		var msgs []string
		var msg []byte
		for {
			f, err := ws.ReadFrame(br)
			if err != nil {
				t.Fatalf("after %q: %v", msgs, err)
			}
			if leaks(f.Payload) || f.Header.Masked || f.Header.Rsv != 0 {
				t.Fatalf("after %q, a frame %+v %q", msgs, f.Header, f.Payload)
			}
			switch {
			case f.Header.OpCode == ws.OpClose:
				code, reason := ws.ParseCloseFrameData(f.Payload)
				msgs = append(msgs, fmt.Sprintf("close %d %s", code, reason))
			case f.Header.OpCode.IsControl():
				msgs = append(msgs, fmt.Sprintf("%v %s", f.Header.OpCode, f.Payload))
				continue
			case !f.Header.Fin && bytes.HasPrefix(f.Payload, []byte("later ")):
				// What cannot be the value's start comes before the
				// rest of the frame is sent.
				ws.WriteFrame(w, ws.MaskFrame(ws.NewTextFrame([]byte("more"))))
				fallthrough
			default:
				msg = append(msg, f.Payload...)
				if !f.Header.Fin {
					continue
				}
				msgs = append(msgs, string(msg))
				msg = nil
				continue
			}
			break
		}
		b64 := base64.StdEncoding.EncodeToString([]byte("Bearer " + testValue))
		want := []string{"authorized Bearer " + ph, "split Bearer " + ph, fmt.Sprint(ws.OpPing, " ", ph), "", "later Bearer " + ph,
			"close 1000 Bearer " + ph}
		if len(msgs) != len(want) || !strings.HasPrefix(msgs[3], b64[:8]) || !strings.Contains(msgs[3], ph) {
			t.Fatalf("messages %q", msgs)
		}
		want[3] = msgs[3]
		if !slices.Equal(msgs, want) {
			t.Errorf("messages %q, want %q", msgs, want)
		}
	})

	t.Run("a compressed frame ends the stream", func(t *testing.T) {
		r := sf.openSecrets(t, []string{"svc"}, "ws.secret.test")
		resp, _, br := sf.dialWebSocket(t, "/compressed")
		if resp.StatusCode != http.StatusSwitchingProtocols || resp.Header.Get("Sec-Websocket-Extensions") != "" {
			t.Fatalf("%d %v", resp.StatusCode, resp.Header)
		}
		f, err := ws.ReadFrame(br)
		if err != nil || f.Header.OpCode != ws.OpClose || leaks(f.Payload) {
			t.Fatalf("%+v %q %v", f.Header, f.Payload, err)
		}
		if code, reason := ws.ParseCloseFrameData(f.Payload); code != ws.StatusProtocolError || !strings.Contains(reason, "runbox egress") {
			t.Errorf("closed %d %q", code, reason)
		}
		if rest, _ := io.ReadAll(br); len(rest) != 0 {
			t.Errorf("after the close frame: %q", rest)
		}
		recs := r.Close()
		if !slices.ContainsFunc(recs, func(e runbox.Egress) bool { return !e.Allowed && strings.Contains(e.Reason, "WebSocket") }) {
			t.Errorf("records %+v", recs)
		}
	})

	for path, want := range map[string]string{"/negotiates": "extension", "/switches": `switched to "test"`} {
		t.Run("a 101 refused: "+path, func(t *testing.T) {
			r := sf.openSecrets(t, []string{"svc"}, "ws.secret.test")
			resp, _, _ := sf.dialWebSocket(t, path)
			body, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != http.StatusBadGateway || leaks(body) || !strings.Contains(string(body), want) {
				t.Errorf("%d %s", resp.StatusCode, body)
			}
			if recs := r.Close(); !slices.ContainsFunc(recs, func(e runbox.Egress) bool { return strings.Contains(e.Reason, want) }) {
				t.Errorf("records %+v", recs)
			}
		})
	}

	t.Run("another protocol", func(t *testing.T) {
		r := sf.openSecrets(t, []string{"svc"}, "ws.secret.test")
		tc, err := sf.tlsThrough(t, "ws.secret.test", sf.ws, "ws.secret.test")
		if err != nil {
			t.Fatal(err)
		}
		before := sf.seen.count()
		fmt.Fprintf(tc, "GET / HTTP/1.1\r\nHost: ws.secret.test:%d\r\nConnection: Upgrade\r\nUpgrade: h2c\r\n\r\n", sf.ws)
		resp, err := http.ReadResponse(bufio.NewReader(tc), nil)
		if err != nil || resp.StatusCode != http.StatusForbidden || sf.seen.count() != before {
			t.Fatalf("%v %v, %d requests reached the server", resp, err, sf.seen.count()-before)
		}
		tc.Close()
		if recs := r.Close(); len(recs) != 1 || recs[0].Allowed || !strings.Contains(recs[0].Reason, `"h2c"`) {
			t.Errorf("records %+v", recs)
		}
	})
}

// rwc is a server's side of a WebSocket for wsScrubber: what it reads.
type rwc struct{ io.Reader }

func (rwc) Write(p []byte) (int, error) { return len(p), nil }
func (rwc) Close() error                { return nil }

func FuzzWSScrubber(f *testing.F) {
	f.Add([]byte("say sk-abcdef12 twice sk-abcdef12"), []byte{5, 9}, []byte{0x81, 0x02, 'h', 'i'}, "sk-abcdef12")
	f.Add([]byte("x"), []byte{}, []byte{0xc1, 0x01, 'x'}, "aaaaaaaa")
	f.Fuzz(func(t *testing.T, msg, cuts, tail []byte, value string) {
		if len(value) < MinSecretBytes || len(value) > 64 || len(cuts) > 16 {
			return
		}
		rd := newRedaction([]Secret{{Name: "a", Value: value}})
		// A message cut into frames where cuts say, then whatever bytes.
		var in bytes.Buffer
		rest, op := msg, ws.OpBinary
		for _, c := range cuts {
			n := min(int(c), len(rest))
			ws.WriteFrame(&in, ws.NewFrame(op, false, rest[:n]))
			rest, op = rest[n:], ws.OpContinuation
		}
		ws.WriteFrame(&in, ws.NewFrame(op, true, rest))
		in.Write(tail)
		for _, oneByte := range []bool{false, true} {
			var r io.Reader = bytes.NewReader(in.Bytes())
			if oneByte {
				r = iotest.OneByteReader(r)
			}
			out, _ := io.ReadAll(newWSScrubber(rwc{r}, rd, func(string) {}))
			// What the program reads is frames a client takes, the
			// message scrubbed as a body would be, nothing after a close.
			br, state := bytes.NewReader(out), ws.StateClientSide
			var got []byte
			first := true
			for br.Len() > 0 {
				fr, err := ws.ReadFrame(br)
				if err != nil || ws.CheckHeader(fr.Header, state) != nil {
					t.Fatalf("one byte %v: frame %+v: %v %v", oneByte, fr.Header, err, ws.CheckHeader(fr.Header, state))
				}
				if fr.Header.OpCode == ws.OpClose {
					if br.Len() > 0 {
						t.Fatalf("one byte %v: %d bytes after a close frame", oneByte, br.Len())
					}
					break
				}
				if fr.Header.OpCode.IsData() || fr.Header.OpCode == ws.OpContinuation {
					state = state.Clear(ws.StateFragmented)
					if !fr.Header.Fin {
						state = state.Set(ws.StateFragmented)
					}
				}
				if first {
					got = append(got, fr.Payload...)
					first = !fr.Header.Fin
				}
			}
			if want := scrubRef(msg, rd); !bytes.Equal(got, want) {
				t.Fatalf("one byte %v: the message %q, want %q", oneByte, got, want)
			}
		}
	})
}
