package e2b

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"
	"time"

	"github.com/runbox-dev/runbox"
	"github.com/runbox-dev/runbox/internal/clients"
	"github.com/runbox-dev/runbox/internal/link"
)

// oneSandbox is a Store of one running sandbox on executor "ex".
type oneSandbox struct {
	Store
	sb runbox.E2BSandbox
}

func (o oneSandbox) E2BSandbox(_ context.Context, id string) (runbox.E2BSandbox, error) {
	if id != o.sb.ID {
		return runbox.E2BSandbox{}, runbox.ErrE2BSandboxNotFound
	}
	return o.sb, nil
}

func (oneSandbox) Owner(context.Context, string) (string, error) { return "ex", nil }

// loopLink dials every port to one address.
type loopLink struct {
	link.Link
	addr string
}

func (l loopLink) Probe(context.Context, string, string, int) ([]string, error) {
	return []string{"box"}, nil
}

func (l loopLink) Dial(ctx context.Context, _, _ string, _ int, _ []string) (net.Conn, error) {
	var d net.Dialer
	return d.DialContext(ctx, "tcp", l.addr)
}

// allowAll lets every call through.
type allowAll struct{ Runs }

func (allowAll) AllowCall(context.Context) error { return nil }

// pausedBody sends its first part, waits, then its second.
type pausedBody struct {
	parts [][]byte
	wait  time.Duration
}

func (b *pausedBody) Read(p []byte) (int, error) {
	if len(b.parts) == 0 {
		return 0, io.EOF
	}
	if len(b.parts) == 1 {
		time.Sleep(b.wait)
	}
	n := copy(p, b.parts[0])
	b.parts = b.parts[1:]
	return n, nil
}

// TestProxyStreams: a call whose answer begins while its body still
// comes (a process's events while its input streams) reaches the sandbox
// whole, through the routing by headers and the sandbox's token.
func TestProxyStreams(t *testing.T) {
	backend := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// The answer begins at once, as a process's start does.
		_ = http.NewResponseController(w).EnableFullDuplex()
		w.(http.Flusher).Flush()
		n, _ := io.Copy(io.Discard, r.Body)
		_, _ = io.WriteString(w, strconv.FormatInt(n, 10))
	}))
	defer backend.Close()
	sb := runbox.E2BSandbox{ID: newID(), Salt: "s", Client: "alice", State: runbox.E2BRunning, EndAt: time.Now().Add(time.Hour)}
	svc := New(Options{Store: oneSandbox{sb: sb}, Runs: allowAll{}, Link: loopLink{addr: backend.Listener.Addr().String()},
		Clients: func(string) (clients.Client, bool) { return clients.Client{}, false }, Secret: []byte("secret")})
	api := httptest.NewServer(NewHandler(svc, HandlerOptions{}))
	defer api.Close()
	body := &pausedBody{parts: [][]byte{[]byte("first part"), []byte("and the rest")}, wait: 200 * time.Millisecond}
	req, _ := http.NewRequest(http.MethodPost, api.URL+Prefix+"/process.Process/StreamInput", body)
	req.Header.Set(headerSandboxID, sb.ID)
	req.Header.Set(headerSandboxPort, "49983")
	req.Header.Set(headerAccessToken, token(svc.key, sb, accessToken))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	got, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil || string(got) != "22" {
		t.Fatalf("the sandbox got %q bytes of 22 (%v)", got, err)
	}
}
