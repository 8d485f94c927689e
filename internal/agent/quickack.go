package agent

import (
	"net"
	"syscall"
)

// quickAck is a connection to a server in the sandbox that acknowledges
// what it receives at once. A server that writes a response in parts (the
// headers, then the body) with Nagle's algorithm on sends the second part
// only once the first is acknowledged; a delayed acknowledgement (up to
// 40 ms), which the kernel chooses for a connection that both sends and
// receives, would hold every response on a kept-alive connection. The
// kernel leaves quick-ack mode on its own, so it is asked for again
// after each write (the request, which puts the connection in that
// interactive mode) and before each read.
//
// It embeds net.Conn, not *net.TCPConn: io.Copy would otherwise use the
// TCP connection's ReadFrom and WriteTo and bypass Read and Write.
type quickAck struct {
	net.Conn
	raw syscall.RawConn
}

func newQuickAck(c net.Conn) net.Conn {
	tc, ok := c.(*net.TCPConn)
	if !ok {
		return c
	}
	raw, err := tc.SyscallConn()
	if err != nil {
		return c
	}
	return &quickAck{Conn: tc, raw: raw}
}

func (c *quickAck) quick() {
	_ = c.raw.Control(func(fd uintptr) {
		_ = syscall.SetsockoptInt(int(fd), syscall.IPPROTO_TCP, syscall.TCP_QUICKACK, 1)
	})
}

func (c *quickAck) Read(p []byte) (int, error) {
	c.quick()
	return c.Conn.Read(p)
}

func (c *quickAck) Write(p []byte) (int, error) {
	n, err := c.Conn.Write(p)
	c.quick()
	return n, err
}
