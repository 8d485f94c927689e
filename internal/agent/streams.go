package agent

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hashicorp/yamux"
)

// ProxyAddr is where the agent listens, on the sandbox's loopback, for
// connections programs make to the executor's egress proxy (HTTP_PROXY).
const ProxyAddr = "127.0.0.1:3128"

// dialTimeout bounds a connection to a port in the sandbox.
const dialTimeout = 5 * time.Second

// streamServer is the agent's end of the streams (mux.go).
type streamServer struct {
	mux muxEnd
	// proxyPort is the port of the proxy listener (0 without one): not a
	// port to dial or report, or a connection would loop back out.
	proxyPort int
	// runs counts the programs started; a proxy stream carries the count
	// of the run it was made in.
	runs atomic.Uint32
	// socket is the executor's proxy socket (proxysocket.go), tried
	// before a stream; "" for none.
	socket string
	// copyOnly is set once the socket took no descriptor: connections
	// are copied to it from then on.
	copyOnly atomic.Bool
	// state saves and restores the kept interpreter (state.go); until
	// it is set, both are refused.
	state atomic.Pointer[starter]
}

func newStreamServer(fw *frameWriter) *streamServer {
	s := &streamServer{}
	s.mux = muxEnd{fw: fw, typ: frameMuxOut, server: true, accept: s.handle}
	return s
}

// listenProxy starts the proxy listener at addr.
func (s *streamServer) listenProxy(addr string) (net.Listener, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, err
	}
	s.proxyPort = ln.Addr().(*net.TCPAddr).Port
	go s.serveProxy(ln)
	return ln, nil
}

// serveProxy carries each connection made to the proxy listener to the
// executor, until the listener closes.
func (s *streamServer) serveProxy(ln net.Listener) { acceptEach(ln, s.proxy) }

func (s *streamServer) proxy(c net.Conn) {
	// The run is read now, as the connection is taken: a program of a
	// later run cannot make it count as its own.
	h := streamHeader{kind: streamProxy, run: s.runs.Load()}
	if s.socket != "" {
		if toProxySocket(s.socket, c, h.run, &s.copyOnly) {
			return
		}
	}
	sess := s.mux.session()
	if sess == nil { // a reset is under way
		c.Close()
		return
	}
	st, err := sess.OpenStream()
	if err != nil {
		c.Close()
		return
	}
	if _, err := st.Write(h.encode()); err != nil {
		c.Close()
		st.Close()
		return
	}
	splice(c, st)
}

// handle serves a stream the executor opened.
func (s *streamServer) handle(st *yamux.Stream) {
	_ = st.SetDeadline(time.Now().Add(headerTimeout))
	h, err := readStreamHeader(st)
	if err != nil {
		st.Close()
		return
	}
	port := int(h.port)
	switch h.kind {
	case streamDial:
		if port == s.proxyPort {
			s.answer(st, answerNo)
			return
		}
		c, err := dialLoopback(port)
		if err != nil {
			a := byte(answerFailed)
			if errors.Is(err, syscall.ECONNREFUSED) {
				a = answerNo
			}
			s.answer(st, a)
			return
		}
		if _, err := st.Write([]byte{answerYes}); err != nil {
			c.Close()
			st.Close()
			return
		}
		_ = st.SetDeadline(time.Time{})
		spliceToPort(newQuickAck(c), st)
	case streamListening:
		a := byte(answerNo)
		if port != s.proxyPort {
			switch yes, err := listening(port); {
			case err != nil:
				a = answerFailed
			case yes:
				a = answerYes
			}
		}
		s.answer(st, a)
	case streamSave, streamRestore:
		_ = st.SetDeadline(time.Time{}) // as long as the executor's context
		serveState(s.state.Load(), st, h)
	default:
		st.Close()
	}
}

func (s *streamServer) answer(st *yamux.Stream, a byte) {
	_, _ = st.Write([]byte{a})
	st.Close()
}

// dialLoopback connects to port on the IPv4 loopback, or on the IPv6 one
// where nothing listens on the first.
func dialLoopback(port int) (net.Conn, error) {
	p := strconv.Itoa(port)
	c, err := net.DialTimeout("tcp4", "127.0.0.1:"+p, dialTimeout)
	if err == nil || !errors.Is(err, syscall.ECONNREFUSED) {
		return c, err
	}
	c, err6 := net.DialTimeout("tcp6", "[::1]:"+p, dialTimeout)
	if err6 == nil {
		return c, nil
	}
	return nil, err // refused on IPv4; IPv6 refused or absent
}

// listening reports whether a TCP socket of the sandbox listens on port,
// IPv4 or IPv6, as the kernel's socket tables say; where they cannot be
// read, a connection is tried.
func listening(port int) (bool, error) {
	found, read := false, 0
	for _, table := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		yes, err := listensIn(table, port)
		if err != nil {
			continue
		}
		read++
		found = found || yes
	}
	if read > 0 {
		return found, nil
	}
	c, err := dialLoopback(port)
	if err == nil {
		c.Close()
		return true, nil
	}
	if errors.Is(err, syscall.ECONNREFUSED) {
		return false, nil
	}
	return false, err
}

// listensIn reads a /proc/net/tcp table: "sl local_address rem_address st
// …", addresses as HEXADDR:HEXPORT, state 0A for LISTEN.
func listensIn(table string, port int) (bool, error) {
	f, err := os.Open(table)
	if err != nil {
		return false, err
	}
	defer f.Close()
	want := fmt.Sprintf(":%04X", port)
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) > 3 && fields[3] == "0A" && strings.HasSuffix(fields[1], want) {
			return true, nil
		}
	}
	return false, sc.Err()
}
