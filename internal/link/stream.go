package link

import (
	"bufio"
	"errors"
	"io"
	"net"
	"sync"
)

// bufferedConn is a connection whose first bytes were read into r.
type bufferedConn struct {
	net.Conn
	r *bufio.Reader
}

func (c *bufferedConn) Read(p []byte) (int, error) { return c.r.Read(p) }

// CloseWrite half-closes the connection when it can.
func (c *bufferedConn) CloseWrite() error { return closeWrite(c.Conn) }

func closeWrite(c net.Conn) error {
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return c.Close()
}

// Splice copies between a and b in both directions until both are done:
// the end of one direction is passed on as a half-close, an error in
// either ends both. It closes both.
func Splice(a, b net.Conn) {
	var once sync.Once
	closeBoth := func() { once.Do(func() { a.Close(); b.Close() }) }
	var wg sync.WaitGroup
	pipe := func(dst, src net.Conn) {
		defer wg.Done()
		_, err := io.Copy(dst, src)
		if err != nil && !errors.Is(err, net.ErrClosed) {
			closeBoth()
			return
		}
		if closeWrite(dst) != nil {
			closeBoth()
		}
	}
	wg.Add(2)
	go pipe(a, b)
	go pipe(b, a)
	wg.Wait()
	closeBoth()
}
