package api

import (
	"bytes"
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/labstack/echo/v4"

	"github.com/runbox-dev/runbox/internal/auth"
	"github.com/runbox-dev/runbox/internal/clients"
	"github.com/runbox-dev/runbox/internal/runs"
)

// countingReader is a body of n bytes that counts what was taken of it.
type countingReader struct {
	left int64
	read atomic.Int64
}

func (r *countingReader) Read(p []byte) (int, error) {
	if r.left == 0 {
		return 0, io.EOF
	}
	n := int(min(int64(len(p)), r.left))
	clear(p[:n])
	r.left -= int64(n)
	r.read.Add(int64(n))
	return n, nil
}

// countingListener counts the bytes the server reads from its
// connections: what it took of a body, whatever the client managed to push
// into the kernel's socket buffers (several MB on loopback) beyond that.
type countingListener struct {
	net.Listener
	read *atomic.Int64
}

func (l countingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return countingConn{Conn: c, read: l.read}, nil
}

type countingConn struct {
	net.Conn
	read *atomic.Int64
}

func (c countingConn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	c.read.Add(int64(n))
	return n, err
}

// gateServer serves h behind a body gate, with the server's ReadTimeout
// readTimeout; read counts the bytes the server has read from the network.
func gateServer(t *testing.T, budget, limit int64, readTimeout time.Duration, h http.HandlerFunc) (srv *httptest.Server, read *atomic.Int64) {
	t.Helper()
	g := newBodyGate(budget, func(*http.Request) (int64, bool) { return limit, true })
	srv = httptest.NewUnstartedServer(g.wrap(h))
	read = new(atomic.Int64)
	srv.Listener = countingListener{Listener: srv.Listener, read: read}
	srv.Config.ReadTimeout = readTimeout
	srv.Start()
	t.Cleanup(srv.Close)
	return srv, read
}

func TestBodyGateRefusesBeforeReading(t *testing.T) {
	const limit = 1 << 20
	tests := []struct {
		name      string
		length    int64 // declared; -1 for chunked
		size      int64
		status    int
		handled   bool
		maxServed int64 // most bytes the server may have read, headers included
	}{
		{"declared too large", 90 << 20, 90 << 20, http.StatusRequestEntityTooLarge, false, 64 << 10},
		{"chunked too large", -1, 90 << 20, http.StatusRequestEntityTooLarge, true, 2 << 20},
		{"within the limit", limit, limit, http.StatusOK, true, limit + 64<<10},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var handled atomic.Bool
			srv, served := gateServer(t, 4*limit, limit, 5*time.Second, func(w http.ResponseWriter, r *http.Request) {
				handled.Store(true)
				_, err := io.ReadAll(r.Body)
				if err != nil {
					http.Error(w, "too large", http.StatusRequestEntityTooLarge)
				}
			})
			req, _ := http.NewRequest(http.MethodPost, srv.URL, &countingReader{left: tt.size})
			req.ContentLength = tt.length
			resp, err := http.DefaultClient.Do(req)
			if err == nil {
				resp.Body.Close()
				if resp.StatusCode != tt.status {
					t.Errorf("status = %d, want %d", resp.StatusCode, tt.status)
				}
			} else if tt.status == http.StatusOK {
				t.Fatal(err)
			}
			if handled.Load() != tt.handled {
				t.Errorf("handler ran = %v, want %v", handled.Load(), tt.handled)
			}
			// The client may have pushed megabytes into socket buffers
			// before the answer came; what counts is what the server read.
			srv.Close()
			if n := served.Load(); n > tt.maxServed {
				t.Errorf("server read %d bytes, want at most %d", n, tt.maxServed)
			}
		})
	}
}

// holdingServer serves bodies behind a gate whose budget is one body of
// limit: a request with the header X-Hold reads its body, calls held, says
// so on inside and waits for release to close.
func holdingServer(t *testing.T, limit int64, held func(*http.Request)) (srv *httptest.Server, inside, release chan struct{}) {
	inside, release = make(chan struct{}), make(chan struct{})
	srv, _ = gateServer(t, limit, limit, 5*time.Second, func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		if r.Header.Get("X-Hold") != "" {
			held(r)
			inside <- struct{}{}
			<-release
		}
	})
	return srv, inside, release
}

func TestBodyGateBudget(t *testing.T) {
	const limit = 1 << 20
	srv, inside, release := holdingServer(t, limit, func(*http.Request) {})
	post := func(hold bool, size int) int {
		req, _ := http.NewRequest(http.MethodPost, srv.URL, bytes.NewReader(make([]byte, size)))
		if hold {
			req.Header.Set("X-Hold", "1")
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Error(err)
			return 0
		}
		resp.Body.Close()
		return resp.StatusCode
	}
	var wg sync.WaitGroup
	wg.Go(func() {
		if code := post(true, limit); code != http.StatusOK {
			t.Errorf("first request: %d", code)
		}
	})
	<-inside
	// The whole budget is held: a second body waits, then is turned away.
	if code := post(false, 10); code != http.StatusServiceUnavailable {
		t.Errorf("second request while the budget is held: %d, want 503", code)
	}
	close(release)
	wg.Wait()
	if code := post(false, 10); code != http.StatusOK {
		t.Errorf("after release: %d", code)
	}
}

// TestBodyGateReleasedOnceDecoded: a handler that has decoded its body
// gives its share of the budget back (runs.ReleaseBody, as a batch does
// before it waits on its callbacks' DNS): another body is taken while it
// still waits (issue 46: a batch held its share for as long as its
// callbacks' DNS took).
func TestBodyGateReleasedOnceDecoded(t *testing.T) {
	const limit = 1 << 20
	srv, inside, release := holdingServer(t, limit, func(r *http.Request) {
		runs.ReleaseBody(r.Context())
		runs.ReleaseBody(r.Context()) // twice is once
	})
	var wg sync.WaitGroup
	wg.Go(func() {
		req, _ := http.NewRequest(http.MethodPost, srv.URL, bytes.NewReader(make([]byte, limit)))
		req.Header.Set("X-Hold", "1")
		if resp, err := http.DefaultClient.Do(req); err != nil || resp.StatusCode != http.StatusOK {
			t.Errorf("the held request: %v, %v", resp, err)
		}
	})
	<-inside
	defer wg.Wait()
	defer close(release)
	start := time.Now()
	resp, err := http.Post(srv.URL, "application/octet-stream", bytes.NewReader(make([]byte, limit)))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || time.Since(start) > budgetWait/2 {
		t.Errorf("a whole budget's body beside one decoded and waiting: %d after %v; want 200 at once", resp.StatusCode, time.Since(start))
	}
}

// TestBodyGateStreamsPastReadTimeout: once its body is read, a handler
// may answer long after the server's ReadTimeout, slowly, with its
// request's context intact.
func TestBodyGateStreamsPastReadTimeout(t *testing.T) {
	srv, _ := gateServer(t, 1<<20, 1<<20, 300*time.Millisecond, func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		for i := range 4 {
			select {
			case <-r.Context().Done():
				return
			case <-time.After(250 * time.Millisecond):
			}
			io.WriteString(w, strings.Repeat("x", i+1))
			http.NewResponseController(w).Flush()
		}
	})
	for _, body := range []io.Reader{nil, strings.NewReader(`{"a":1}`)} {
		method := http.MethodGet
		if body != nil {
			method = http.MethodPost
		}
		req, _ := http.NewRequest(method, srv.URL, body)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		got, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || string(got) != "xxxxxxxxxx" {
			t.Errorf("%s: body %q, %v", method, got, err)
		}
	}
}

func TestRequestCap(t *testing.T) {
	c := newRequestCap(nil)
	tiers := map[string]clients.Tier{"small": {ConcurrentRequests: 1}, "big": {ConcurrentRequests: 2}}
	release := make(chan struct{})
	entered := make(chan struct{}, 4)
	h := c.middleware(func(echo.Context) error {
		entered <- struct{}{}
		<-release
		return nil
	})
	e := echo.New()
	call := func(client string) error {
		req := httptest.NewRequest(http.MethodGet, "/", nil)
		req = req.WithContext(auth.WithClient(context.Background(), clients.Client{Name: client, Tier: tiers[client]}))
		return h(e.NewContext(req, httptest.NewRecorder()))
	}
	var wg sync.WaitGroup
	for _, client := range []string{"small", "big", "big"} {
		wg.Go(func() {
			if err := call(client); err != nil {
				t.Errorf("%s: %v", client, err)
			}
		})
		<-entered
	}
	for _, client := range []string{"small", "big"} {
		if err := call(client); err != errTooManyRequests {
			t.Errorf("%s past its cap: %v", client, err)
		}
	}
	close(release)
	wg.Wait()
	release = make(chan struct{})
	close(release)
	if err := call("small"); err != nil {
		t.Errorf("after the others finished: %v", err)
	}
}
