package link

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"sync"
	"time"

	"github.com/runbox-dev/runbox"
)

// addrTTL is how long Remote trusts an executor's announced address: a
// restarted executor announces a new one within its heartbeat.
const addrTTL = 2 * time.Second

// Remote is the Link of an api whose executors run elsewhere: it finds
// each one's address in its heartbeat and speaks HTTP to it.
type Remote struct {
	store  Executors
	key    []byte
	client *http.Client
	dialer net.Dialer
	now    func() time.Time

	mu    sync.Mutex
	addrs map[string]cachedAddr
}

type cachedAddr struct {
	addr string
	at   time.Time
}

var _ Link = (*Remote)(nil)

// Executors reads what executors announce in their heartbeats
// (store.Executors): ExecutorInfo returns runbox.ErrExecutorGone for one that
// is not alive.
type Executors interface {
	ExecutorInfo(ctx context.Context, id string) (runbox.ExecutorInfo, error)
}

// NewRemote returns a Remote that reads addresses from st and signs with
// key (Key of the shared secret).
func NewRemote(st Executors, key []byte) *Remote {
	return &Remote{
		store: st, key: key, now: time.Now, addrs: map[string]cachedAddr{},
		client: &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 8, IdleConnTimeout: time.Minute}},
	}
}

// addr returns where executor listens; ErrGone when it is not alive.
func (r *Remote) addr(ctx context.Context, executor string) (string, error) {
	r.mu.Lock()
	c, ok := r.addrs[executor]
	r.mu.Unlock()
	if ok && r.now().Sub(c.at) < addrTTL {
		return c.addr, nil
	}
	info, err := r.store.ExecutorInfo(ctx, executor)
	if errors.Is(err, runbox.ErrExecutorGone) || (err == nil && info.Addr == "") {
		return "", ErrGone
	}
	if err != nil {
		return "", err
	}
	r.mu.Lock()
	r.addrs[executor] = cachedAddr{addr: info.Addr, at: r.now()}
	r.mu.Unlock()
	return info.Addr, nil
}

func (r *Remote) request(ctx context.Context, executor, method, path string, q url.Values, body []byte) (*http.Request, error) {
	addr, err := r.addr(ctx, executor)
	if err != nil {
		return nil, err
	}
	req, err := http.NewRequestWithContext(ctx, method, "http://"+addr+path+"?"+q.Encode(), bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	sign(r.key, r.now(), req, body)
	return req, nil
}

// do makes a request and decodes its JSON answer into out (if not nil).
func (r *Remote) do(ctx context.Context, executor, method, path string, q url.Values, body []byte, out any) error {
	req, err := r.request(ctx, executor, method, path, q, body)
	if err != nil {
		return err
	}
	resp, err := r.client.Do(req)
	if err != nil {
		return fmt.Errorf("link to executor %s: %w", executor, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode >= 300 {
		return replyError(executor, resp)
	}
	if out == nil {
		return nil
	}
	if err := json.NewDecoder(resp.Body).Decode(out); err != nil {
		return fmt.Errorf("link to executor %s: %w", executor, err)
	}
	return nil
}

// replyError turns an executor's error answer back into the error it
// stands for.
func replyError(executor string, resp *http.Response) error {
	var e wireError
	_ = json.NewDecoder(io.LimitReader(resp.Body, 64<<10)).Decode(&e)
	switch {
	case resp.StatusCode == http.StatusGone:
		return ErrGone
	case resp.StatusCode == http.StatusConflict:
		return ErrNotListening
	case resp.StatusCode == http.StatusNotFound && e.Error == codeNoRun:
		return ErrNoRun
	case resp.StatusCode == http.StatusBadRequest && e.Error != "" && e.Error != runbox.EInternal:
		return &runbox.Error{Code: e.Error, Message: e.Message}
	}
	return fmt.Errorf("link to executor %s: %s %s", executor, resp.Status, e.Message)
}

func targetQuery(conv string, port int) url.Values {
	return url.Values{"conv": {conv}, "port": {strconv.Itoa(port)}}
}

func (r *Remote) Probe(ctx context.Context, executor, conv string, port int) ([]string, error) {
	var reply probeReply
	if err := r.do(ctx, executor, http.MethodGet, "/probe", targetQuery(conv, port), nil, &reply); err != nil {
		return nil, err
	}
	return reply.Sandboxes, nil
}

func (r *Remote) WriteFiles(ctx context.Context, executor, conv string, files []File) error {
	body, err := json.Marshal(files)
	if err != nil {
		return err
	}
	return r.do(ctx, executor, http.MethodPost, "/files", url.Values{"conv": {conv}}, body, nil)
}

func (r *Remote) Output(ctx context.Context, executor, run string) (Output, error) {
	var out Output
	err := r.do(ctx, executor, http.MethodGet, "/output", url.Values{"run": {run}}, nil, &out)
	return out, err
}

// Dial opens a connection to the executor, asks it to switch to a stream
// to the port, and returns the connection once it has.
func (r *Remote) Dial(ctx context.Context, executor, conv string, port int, sandboxes []string) (net.Conn, error) {
	q := targetQuery(conv, port)
	q["sandbox"] = sandboxes
	req, err := r.request(ctx, executor, http.MethodGet, "/dial", q, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Connection", "Upgrade")
	req.Header.Set("Upgrade", upgrade)
	conn, err := r.dialer.DialContext(ctx, "tcp", req.URL.Host)
	if err != nil {
		return nil, fmt.Errorf("link to executor %s: %w", executor, err)
	}
	// The exchange is bounded by ctx; the stream after it is not.
	stop := context.AfterFunc(ctx, func() { _ = conn.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	if err := req.Write(conn); err != nil {
		conn.Close()
		return nil, fmt.Errorf("link to executor %s: %w", executor, err)
	}
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, req)
	if err != nil {
		conn.Close()
		return nil, fmt.Errorf("link to executor %s: %w", executor, err)
	}
	if resp.StatusCode != http.StatusSwitchingProtocols {
		defer conn.Close()
		defer resp.Body.Close()
		return nil, replyError(executor, resp)
	}
	if !stop() {
		conn.Close()
		return nil, ctx.Err()
	}
	return &bufferedConn{Conn: conn, r: br}, nil
}
