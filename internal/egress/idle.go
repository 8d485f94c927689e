package egress

import (
	"container/list"
	"crypto/tls"
	"io"
	"net"
	"net/http/httptrace"
	"sync"
	"sync/atomic"
	"time"
)

// Idleness: connections that move nothing for IdleTimeout end, and the
// upstream connections kept idle for reuse stay within MaxIdle.

// activity closes connections that moved no byte, either way, for idle:
// a program's connection and what it is tunnelled to end together.
type activity struct {
	t       *time.Timer
	idle    time.Duration
	mu      sync.Mutex
	closers []io.Closer
}

func newActivity(idle time.Duration) *activity {
	a := &activity{idle: idle}
	a.t = time.AfterFunc(idle, a.fire)
	return a
}

func (a *activity) add(c io.Closer) {
	a.mu.Lock()
	a.closers = append(a.closers, c)
	a.mu.Unlock()
}

func (a *activity) fire() {
	a.mu.Lock()
	closers := a.closers
	a.mu.Unlock()
	for _, c := range closers {
		c.Close()
	}
}

func (a *activity) touch() { a.t.Reset(a.idle) }
func (a *activity) stop()  { a.t.Stop() }

// activeConn is a program's connection, whose every read and write
// counts as activity.
type activeConn struct {
	net.Conn
	act *activity
}

func (c *activeConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.act.touch()
	return n, err
}

func (c *activeConn) Write(p []byte) (int, error) {
	n, err := c.Conn.Write(p)
	c.act.touch()
	return n, err
}

// idleTrace follows, for the proxy's account of idle connections, the
// connection a run's pool takes for a request (an upstream, or TLS over
// one) and gives back.
func (p *Proxy) idleTrace() *httptrace.ClientTrace {
	var used atomic.Pointer[upstream]
	return &httptrace.ClientTrace{
		GotConn: func(info httptrace.GotConnInfo) {
			c := info.Conn
			if tc, ok := c.(*tls.Conn); ok {
				c = tc.NetConn()
			}
			if u, ok := c.(*upstream); ok {
				used.Store(u)
				p.idle.taken(u)
			}
		},
		PutIdleConn: func(err error) {
			if u := used.Load(); u != nil {
				p.idle.returned(u, err == nil)
			}
		},
	}
}

// idleConns keeps the upstream connections idle in runs' pools, oldest
// first, so that together they stay within a bound: past it the oldest
// is closed, and its run's pool lets it go. (Each run's pool has a bound
// of its own, MaxIdlePerRun; this one is over all runs.)
type idleConns struct {
	mu   sync.Mutex
	max  int
	list list.List // of *upstream
}

// taken marks u in use.
func (ic *idleConns) taken(u *upstream) {
	ic.mu.Lock()
	defer ic.mu.Unlock()
	u.gets++
	if u.idle != nil {
		ic.list.Remove(u.idle)
		u.idle = nil
	}
}

// returned marks u given back to its pool (kept: idle there). A pool may
// hand a connection to its next request before the last one's return is
// told: it is idle only once every taking was given back.
func (ic *idleConns) returned(u *upstream, kept bool) {
	ic.mu.Lock()
	u.puts++
	var oldest *upstream
	if kept && u.puts == u.gets && !u.gone && u.idle == nil {
		u.idle = ic.list.PushBack(u)
		if ic.list.Len() > ic.max {
			oldest = ic.list.Remove(ic.list.Front()).(*upstream)
			oldest.idle = nil
		}
	}
	ic.mu.Unlock()
	if oldest != nil {
		oldest.Close()
	}
}

// forget takes a closed connection out of the account.
func (ic *idleConns) forget(u *upstream) {
	ic.mu.Lock()
	defer ic.mu.Unlock()
	u.gone = true
	if u.idle != nil {
		ic.list.Remove(u.idle)
		u.idle = nil
	}
}
