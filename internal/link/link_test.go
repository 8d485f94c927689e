package link

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/runbox-dev/runbox"
	"github.com/runbox-dev/runbox/internal/store"
	"github.com/runbox-dev/runbox/internal/testenv"
)

// backend is an executor's side over real loopback listeners: each port
// of a conversation is a listener the test serves.
type backend struct {
	mu        sync.Mutex
	sandboxes map[string][]string       // by conversation
	ports     map[string]map[int]string // conversation → port → address
	written   map[string][]File
	outputs   map[string]Output
}

func newBackend() *backend {
	return &backend{sandboxes: map[string][]string{}, ports: map[string]map[int]string{},
		written: map[string][]File{}, outputs: map[string]Output{}}
}

func (b *backend) Sandboxes(conv string) []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.sandboxes[conv]
}

func (b *backend) DialPort(ctx context.Context, conv string, port int) (net.Conn, error) {
	b.mu.Lock()
	addr, ok := b.ports[conv][port]
	b.mu.Unlock()
	if !ok {
		return nil, ErrNotListening
	}
	var d net.Dialer
	return d.DialContext(ctx, "tcp", addr)
}

func (b *backend) WriteFiles(_ context.Context, conv string, files []File) error {
	for _, f := range files {
		if strings.Contains(f.Path, "..") {
			return runbox.Errorf("PATH_TRAVERSAL", "no")
		}
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.written[conv] = append(b.written[conv], files...)
	return nil
}

func (b *backend) Output(run string) (Output, bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	o, ok := b.outputs[run]
	return o, ok
}

// echo serves a line-echo on a loopback port and returns its address.
func echo(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				_, _ = io.Copy(c, c)
			}()
		}
	}()
	return ln.Addr().String()
}

// setup starts a link server for executor "ex1" over b, and a Remote
// that finds it through Redis.
func setup(t *testing.T, b Backend) (*Remote, string, *Server) {
	t.Helper()
	_, url := testenv.Miniredis(t)
	st := store.New(store.NewConn(testenv.Client(t, url)))
	key := Key([]byte("a shared secret of the deployment"))
	ln, addr, err := Listen("127.0.0.1:0", "")
	if err != nil {
		t.Fatal(err)
	}
	srv := NewServer(ServerOptions{Listener: ln, Key: key, Backend: b})
	if err := srv.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Stop)
	if err := st.Heartbeat(context.Background(), runbox.ExecutorInfo{ID: "ex1", Addr: addr}, time.Minute); err != nil {
		t.Fatal(err)
	}
	return NewRemote(st, key), addr, srv
}

func TestRemote(t *testing.T) {
	b := newBackend()
	b.sandboxes["c1"] = []string{"sb1", "sb2"}
	b.ports["c1"] = map[int]string{8000: echo(t)}
	b.outputs["run_1"] = Output{Stdout: "hello\n", StderrDropped: 3}
	for _, l := range []Link{Local{ID: "ex1", Backend: b}, first(setup(t, b))} {
		t.Run(fmt.Sprintf("%T", l), func(t *testing.T) {
			ctx := context.Background()
			live, err := l.Probe(ctx, "ex1", "c1", 8000)
			if err != nil || strings.Join(live, ",") != "sb1,sb2" {
				t.Fatalf("probe: %v %v", live, err)
			}
			if _, err := l.Probe(ctx, "ex1", "c1", 9000); !errors.Is(err, ErrNotListening) {
				t.Errorf("probe of a closed port: %v", err)
			}
			if _, err := l.Probe(ctx, "ex1", "c2", 8000); !errors.Is(err, ErrGone) {
				t.Errorf("probe of a conversation without sandbox: %v", err)
			}
			if _, err := l.Probe(ctx, "ex2", "c1", 8000); !errors.Is(err, ErrGone) {
				t.Errorf("probe on an executor that is not there: %v", err)
			}

			c, err := l.Dial(ctx, "ex1", "c1", 8000, []string{"sb0", "sb2"})
			if err != nil {
				t.Fatal(err)
			}
			// Both directions, several exchanges on one stream.
			r := bufio.NewReader(c)
			for i := range 3 {
				fmt.Fprintf(c, "line %d\n", i)
				got, err := r.ReadString('\n')
				if err != nil || got != fmt.Sprintf("line %d\n", i) {
					t.Fatalf("echo %d: %q %v", i, got, err)
				}
			}
			c.Close()
			if _, err := l.Dial(ctx, "ex1", "c1", 8000, []string{"sb-recycled"}); !errors.Is(err, ErrGone) {
				t.Errorf("dial for a sandbox that ended: %v", err)
			}
			if _, err := l.Dial(ctx, "ex1", "c1", 9000, []string{"sb1"}); !errors.Is(err, ErrNotListening) {
				t.Errorf("dial of a closed port: %v", err)
			}

			if err := l.WriteFiles(ctx, "ex1", "c1", []File{{Path: "src/a.js", Data: []byte("x")}}); err != nil {
				t.Fatal(err)
			}
			err = l.WriteFiles(ctx, "ex1", "c1", []File{{Path: "../a.js"}})
			if e, ok := errors.AsType[*runbox.Error](err); !ok || e.Code != "PATH_TRAVERSAL" {
				t.Errorf("a refused write comes back as the backend's error: %v", err)
			}
			out, err := l.Output(ctx, "ex1", "run_1")
			if err != nil || out.Stdout != "hello\n" || out.StderrDropped != 3 {
				t.Errorf("output: %+v %v", out, err)
			}
			if _, err := l.Output(ctx, "ex1", "run_2"); !errors.Is(err, ErrNoRun) {
				t.Errorf("output of a run not here: %v", err)
			}
		})
	}
}

func first[T any](v T, _ ...any) T { return v }

// TestServerRefusesUnsigned checks that only requests signed with the key,
// recently, are served.
func TestServerRefusesUnsigned(t *testing.T) {
	b := newBackend()
	b.sandboxes["c1"] = []string{"sb1"}
	b.ports["c1"] = map[int]string{8000: echo(t)}
	_, addr, _ := setup(t, b)
	key := Key([]byte("a shared secret of the deployment"))
	cases := []struct {
		name string
		sign func(r *http.Request)
	}{
		{"unsigned", func(*http.Request) {}},
		{"another key", func(r *http.Request) { sign(Key([]byte("another secret")), time.Now(), r, nil) }},
		{"too old", func(r *http.Request) { sign(key, time.Now().Add(-2*time.Minute), r, nil) }},
		{"from the future", func(r *http.Request) { sign(key, time.Now().Add(2*time.Minute), r, nil) }},
		{"another request's", func(r *http.Request) {
			other, _ := http.NewRequest(http.MethodGet, "http://"+addr+"/probe?conv=c1&port=8001", nil)
			sign(key, time.Now(), other, nil)
			r.Header.Set(authHeader, other.Header.Get(authHeader))
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			r, _ := http.NewRequest(http.MethodGet, "http://"+addr+"/probe?conv=c1&port=8000", nil)
			tc.sign(r)
			resp, err := http.DefaultClient.Do(r)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusUnauthorized {
				t.Errorf("status %d, want 401", resp.StatusCode)
			}
		})
	}
}

// TestStopClosesStreams checks that an executor that stops ends the
// streams it serves.
func TestStopClosesStreams(t *testing.T) {
	b := newBackend()
	b.sandboxes["c1"] = []string{"sb1"}
	b.ports["c1"] = map[int]string{8000: echo(t)}
	remote, _, srv := setup(t, b)
	c, err := remote.Dial(context.Background(), "ex1", "c1", 8000, []string{"sb1"})
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	srv.Stop()
	_ = c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := c.Read(make([]byte, 1)); err == nil {
		t.Error("the stream outlived its server")
	}
}
