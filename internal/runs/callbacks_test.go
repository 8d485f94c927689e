package runs

import (
	"context"
	"encoding/base64"
	"fmt"
	"net/netip"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/runbox-dev/runbox"
	"github.com/runbox-dev/runbox/internal/clients"
	"github.com/runbox-dev/runbox/internal/egress"
	"github.com/runbox-dev/runbox/internal/testenv"
	"github.com/runbox-dev/runbox/internal/webhooks"
	"github.com/runbox-dev/runbox/internal/webhooks/signature"
)

// slowDNS answers each lookup with a public address after 4 s — within
// a lookup's own bound of 5 s — unless its context ends first. It notes
// whether the request's body had been given back when the first lookup
// began.
type slowDNS struct {
	lookups       atomic.Int64
	bodyBeforeDNS *atomic.Bool
	released      *atomic.Bool
}

func (d *slowDNS) LookupNetIP(ctx context.Context, _, _ string) ([]netip.Addr, error) {
	if d.lookups.Add(1) == 1 {
		d.bodyBeforeDNS.Store(d.released.Load())
	}
	select {
	case <-time.After(4 * time.Second):
		return []netip.Addr{netip.MustParseAddr("93.184.216.34")}, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// TestBatchCallbacksBounded: a batch whose thousand runs name 32 hosts
// whose DNS takes 4 s to answer is answered within one bound of time for
// them all (5 s: the hosts not resolved by then refuse it), not 4 s a
// host, one after the other (issue 46: over two minutes), and it has given
// its body's share of the api's budget back before it waits.
func TestBatchCallbacksBounded(t *testing.T) {
	s, st, _ := newServiceOn(t, testenv.Redis(t))
	withExecutor(t, st)
	var released, before atomic.Bool
	dns := &slowDNS{bodyBeforeDNS: &before, released: &released}
	allow, err := egress.ParseList("*.silent.example")
	if err != nil {
		t.Fatal(err)
	}
	secrets, err := signature.Parse([]string{"whsec_" + base64.StdEncoding.EncodeToString([]byte("a-secret-of-thirty-two-bytes-ok!"))})
	if err != nil {
		t.Fatal(err)
	}
	s.Callbacks = webhooks.New(nil, nil, webhooks.Options{
		Policy:  &webhooks.Policy{Allow: allow, Resolver: dns, Own: func() map[netip.Addr]bool { return nil }},
		Clients: map[string]webhooks.Client{"alice": {Secrets: secrets}},
	})
	req := batchOf(runbox.MaxBatchRuns)
	for i := range req.Runs {
		req.Runs[i].CallbackURL = fmt.Sprintf("https://h%d.silent.example/hook?run=%d", i%webhooks.MaxCallbackHosts, i)
	}
	ctx := WithBody(asClient("alice", clients.Tier{}), func() { released.Store(true) })
	type outcome struct {
		err  error
		took time.Duration
	}
	done := make(chan outcome, 1)
	go func() {
		start := time.Now()
		_, err := s.SubmitBatch(ctx, req)
		done <- outcome{err, time.Since(start)}
	}()
	select {
	case o := <-done:
		t.Logf("a batch naming %d slow hosts was answered after %v: %v", webhooks.MaxCallbackHosts, o.took.Round(time.Millisecond), o.err)
		if runbox.ErrorCode(o.err) != runbox.EInvalid || !strings.Contains(runbox.ErrorMessage(o.err), "callback_url: h") {
			t.Errorf("SubmitBatch: %v; want a run's callback refused", o.err)
		}
		if o.took > 8*time.Second {
			t.Errorf("answered after %v; want within the 5 s bound", o.took)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("SubmitBatch had not answered after 30 s")
	}
	if n := dns.lookups.Load(); n == 0 || n > webhooks.MaxCallbackHosts {
		t.Errorf("%d lookups; want one a host at most, %d", n, webhooks.MaxCallbackHosts)
	}
	if !before.Load() {
		t.Error("the body's share of the budget was still held when the DNS lookups began")
	}
}
