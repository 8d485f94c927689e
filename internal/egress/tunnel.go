package egress

import (
	"bufio"
	"errors"
	"io"
	"net"
	"net/http"
)

// tunnel serves a CONNECT: the program's bytes go to the target and back
// until either side ends.
func (r *Run) tunnel(c net.Conn, br *bufio.Reader, t target, act *activity) {
	up, err := r.connect(r.ctx, t, act)
	if err != nil {
		var ref *refusal
		if errors.As(err, &ref) {
			writeRefusal(c, http.StatusForbidden, ref.reason)
		} else {
			writeRefusal(c, http.StatusBadGateway, "could not connect to "+t.host)
		}
		return
	}
	defer up.Close()
	if _, err := io.WriteString(c, "HTTP/1.1 200 Connection established\r\n\r\n"); err != nil {
		return
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		// What the program sent, bytes it sent after the head first.
		if _, err := io.Copy(up, br); err != nil {
			up.Close()
		} else if cw, ok := up.(*upstream).Conn.(closeWriter); ok {
			_ = cw.CloseWrite()
		}
	}()
	_, _ = io.CopyBuffer(c, up, make([]byte, copyBuffer))
	c.Close() // ends the other direction too
	<-done
}

// closeWriter is a connection whose sending side can be closed alone.
type closeWriter interface{ CloseWrite() error }
