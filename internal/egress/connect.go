package egress

import (
	"container/list"
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"sync"

	"github.com/runbox-dev/runbox"
)

// refusal is a connection the policy refused after resolving its name.
type refusal struct{ reason string }

func (e *refusal) Error() string { return e.reason }

// connect resolves t (or maps it), checks every address, and dials one,
// counting what goes through against the run's bounds. act, if set, is
// the activity of the program's connection the result is tunnelled to.
func (r *Run) connect(ctx context.Context, t target, act *activity) (net.Conn, error) {
	rec := runbox.Egress{Host: t.host, Port: int(t.port)}
	addrs, reason := r.resolve(ctx, t)
	if reason != "" {
		rec.Reason = reason
		r.add(rec)
		return nil, &refusal{reason}
	}
	rec.Allowed = true
	d := net.Dialer{Timeout: r.p.s.ConnectTimeout}
	var err error
	for _, a := range addrs {
		var c net.Conn
		if c, err = d.DialContext(ctx, "tcp", a.String()); err == nil {
			u := &upstream{Conn: c, r: r, rec: rec, act: act}
			if act == nil {
				u.act, u.own = newActivity(r.p.s.IdleTimeout), true
			}
			u.act.add(u)
			if !r.track(u) {
				u.Close()
				return nil, net.ErrClosed
			}
			return u, nil
		}
	}
	rec.Reason = "could not connect: " + dialError(err)
	r.add(rec)
	return nil, err
}

// resolve returns the addresses t may be dialled at, or why none.
func (r *Run) resolve(ctx context.Context, t target) ([]netip.AddrPort, string) {
	rctx, cancel := context.WithTimeout(ctx, r.p.s.ConnectTimeout)
	defer cancel()
	return Resolve(rctx, r.p.s.Resolver, r.p.s.Hosts, *r.p.own.Load(), r.p.s.Deny, t.host, t.port)
}

func dialError(err error) string {
	var ne net.Error
	switch {
	case err == nil:
		return "no address"
	case errors.As(err, &ne) && ne.Timeout():
		return "timed out"
	case strings.Contains(err.Error(), "refused"):
		return "connection refused"
	}
	return "network error"
}

// upstream is a connection the proxy dialled for a run: what crosses it
// counts against the run's bytes, and it is recorded once closed.
type upstream struct {
	net.Conn
	r    *Run
	act  *activity
	own  bool // act is this connection's own
	once sync.Once

	mu  sync.Mutex
	rec runbox.Egress

	// Guarded by the proxy's idleConns: how often the run's pool took and
	// gave the connection back, and its place among the idle ones.
	gets, puts int
	idle       *list.Element
	gone       bool
}

func (u *upstream) Read(p []byte) (int, error) {
	n, err := u.Conn.Read(p)
	u.count(int64(n), 0)
	return n, err
}

// Write counts p before it goes: past the run's bytes it does not, and
// a Close that races the write's return still records it.
func (u *upstream) Write(p []byte) (int, error) {
	if u.count(0, int64(len(p))) {
		return 0, net.ErrClosed
	}
	return u.Conn.Write(p)
}

// count adds what crossed; past the run's bytes, the connection is cut,
// and count says so.
func (u *upstream) count(in, out int64) bool {
	if in+out == 0 {
		return false
	}
	u.act.touch()
	u.mu.Lock()
	u.rec.BytesIn += in
	u.rec.BytesOut += out
	u.mu.Unlock()
	if u.r.used.Add(in+out) > u.r.p.s.MaxBytes {
		u.mu.Lock()
		u.rec.Reason = fmt.Sprintf("cut at the run's limit of %d bytes", u.r.p.s.MaxBytes)
		u.mu.Unlock()
		u.Conn.Close()
		return true
	}
	return false
}

func (u *upstream) Close() error {
	err := u.Conn.Close()
	u.once.Do(func() {
		if u.own {
			u.act.stop()
		}
		// Recorded before it is untracked: a Run.Close that no longer
		// finds it among the run's connections finds its record.
		u.mu.Lock()
		rec := u.rec
		u.mu.Unlock()
		u.r.add(rec)
		u.r.p.idle.forget(u)
		u.r.untrack(u)
	})
	return err
}
