package webhooks

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"net/url"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/runbox-dev/runbox"
	"github.com/runbox-dev/runbox/internal/egress"
	"github.com/runbox-dev/runbox/internal/webhooks/signature"
)

// fakeResolver resolves the names it holds.
type fakeResolver map[string][]string

func (r fakeResolver) LookupNetIP(_ context.Context, _, host string) ([]netip.Addr, error) {
	var out []netip.Addr
	for _, a := range r[host] {
		out = append(out, netip.MustParseAddr(a))
	}
	if len(out) == 0 {
		return nil, errors.New("no such host")
	}
	return out, nil
}

func testPolicy(t testing.TB) *Policy {
	allow, err := egress.ParseList("hooks.example,*.sub.example,localhost,meta.example,mixed.example,own.example,recv.test,nxdomain.example,*.special.example")
	if err != nil {
		t.Fatal(err)
	}
	hosts, err := egress.ParseHosts("recv.test=127.0.0.1:8080")
	if err != nil {
		t.Fatal(err)
	}
	return &Policy{Allow: allow, Hosts: hosts,
		Resolver: fakeResolver{
			"hooks.example":   {"93.184.216.34"},
			"a.sub.example":   {"93.184.216.35"},
			"client.example":  {"93.184.216.36", "2606:2800:220:1::1"},
			"localhost":       {"127.0.0.1", "::1"},
			"meta.example":    {"169.254.169.254"},
			"mixed.example":   {"93.184.216.34", "10.0.0.1"},
			"own.example":     {"8.8.4.4"},
			"mapped6.example": {"::ffff:127.0.0.1"},
			// IANA's special-purpose IPv6 ranges (and a few IPv4 ones)
			// that carry or stand in for an address not to be reached.
			"compat.special.example":     {"::7f00:1"},
			"compatpub.special.example":  {"::5db8:d822"},
			"translated.special.example": {"::ffff:0:a00:1"},
			"discard.special.example":    {"100::1"},
			"dummy.special.example":      {"100:0:0:1::1"},
			"ietf.special.example":       {"2001:2::1"},
			"doc.special.example":        {"3fff::1"},
			"srv6.special.example":       {"5f00::1"},
			"relay.special.example":      {"192.88.99.1"},
		},
		Own: func() map[netip.Addr]bool { return map[netip.Addr]bool{netip.MustParseAddr("8.8.4.4"): true} },
	}
}

var clientDomains = egress.Patterns{must(egress.ParsePattern("client.example"))}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

func TestCallbackAccepted(t *testing.T) {
	p := testPolicy(t)
	for raw, want := range map[string]string{
		"https://hooks.example/path?q=1":     "https://hooks.example/path?q=1",
		"HTTPS://HOOKS.Example./x":           "https://hooks.example/x",
		"https://hooks.example:443/":         "https://hooks.example:443/",
		"https://a.sub.example/hook":         "https://a.sub.example/hook",
		"https://client.example/hook":        "https://client.example/hook",
		"http://recv.test:8080/hook":         "http://recv.test:8080/hook",
		"https://recv.test:8080/hook":        "https://recv.test:8080/hook",
		"http://recv.test.:8080/h?x=%2F&y=1": "http://recv.test:8080/h?x=%2F&y=1",
	} {
		got, err := p.Check(context.Background(), raw, clientDomains)
		if err != nil || got != want {
			t.Errorf("Check(%q) = %q, %v; want %q", raw, got, err, want)
		}
	}
}

// TestCallbackAttacks: every way to point a callback at what it must not
// reach is refused at submit time, with a clear invalid_argument.
func TestCallbackAttacks(t *testing.T) {
	p := testPolicy(t)
	for _, raw := range []string{
		// Address literals in every form.
		"https://127.0.0.1/", "https://127.0.0.1./", "https://2130706433/", "https://0x7f000001/", "https://0177.0.0.1/",
		"https://0x7f.0.0.1/", "https://127.1/", "https://0/", "https://0.0.0.0/", "https://[::1]/", "https://[::]/",
		"https://[::ffff:127.0.0.1]/", "https://[0:0:0:0:0:ffff:7f00:1]/", "https://[::ffff:7f00:1]/", "https://[fe80::1%25eth0]/",
		"https://169.254.169.254/latest/meta-data/", "https://[fd00:ec2::254]/", "https://100.100.100.200/",
		"https://%31%32%37.0.0.1/", "https://127.0.0.1:443/", "https://1.1.1.1/",
		// Names that are addresses, or not ASCII.
		"https://①②⑦.0.0.1/", "https://127。0。0。1/", "https://ｈｏｏｋｓ.example/", "https://hooks.exampl\u0435/",
		// User info, backslashes, spaces, fragments.
		"https://evil@127.0.0.1/", "https://hooks.example@127.0.0.1/", "https://user:pw@hooks.example/",
		"https://hooks.example\\@127.0.0.1/", "https://hooks.example /", "https://hooks.example/#frag",
		"https://hooks.example/\r\nX: y",
		// Schemes, ports, hosts not allowed.
		"http://hooks.example/", "ftp://hooks.example/", "javascript:alert(1)", "//hooks.example/", "https:/hooks.example/",
		"hooks.example", "https://hooks.example:8443/", "https://hooks.example:0/", "https://hooks.example:99999/",
		"http://recv.test:9999/", "http://recv.test/", "https://other.example/", "https://sub.example/",
		"https://hooks.example.evil.com/", "https://" + strings.Repeat("a", 2050) + ".example/",
		// Names that resolve to what they must not lead to.
		"https://localhost/", "https://meta.example/", "https://mixed.example/", "https://own.example/",
		"https://nxdomain.example/", "https://mapped6.example/", "https://compat.special.example/",
		"https://compatpub.special.example/", "https://translated.special.example/", "https://discard.special.example/",
		"https://dummy.special.example/", "https://ietf.special.example/", "https://doc.special.example/",
		"https://srv6.special.example/", "https://relay.special.example/",
	} {
		got, err := p.Check(context.Background(), raw, clientDomains)
		if err == nil {
			t.Errorf("Check(%q) accepted as %q", raw, got)
			continue
		}
		if runbox.ErrorCode(err) != runbox.EInvalid || !strings.HasPrefix(runbox.ErrorMessage(err), "callback_url: ") {
			t.Errorf("Check(%q): %v", raw, err)
		}
	}
}

// FuzzParse: whatever Parse accepts names an allowed host, never an
// address, and requests exactly that host and port.
func FuzzParse(f *testing.F) {
	for _, s := range []string{"https://hooks.example/x", "http://recv.test:8080/", "https://127.0.0.1/",
		"https://[::ffff:127.0.0.1]/", "https://evil@hooks.example/", "https://HOOKS.example.:443/a?b#c"} {
		f.Add(s)
	}
	p := testPolicy(f)
	f.Fuzz(func(t *testing.T, raw string) {
		tg, err := p.Parse(raw, clientDomains)
		if err != nil {
			return
		}
		if _, err := netip.ParseAddr(tg.Host); err == nil || !egress.IsHostName(tg.Host) {
			t.Fatalf("%q accepted with host %q", raw, tg.Host)
		}
		if !p.Allow.Match(tg.Host) && !clientDomains.Match(tg.Host) {
			t.Fatalf("%q accepted for a host not allowed: %q", raw, tg.Host)
		}
		u, err := url.Parse(tg.URL)
		if err != nil || u.User != nil || egress.NormalizeHost(u.Hostname()) != tg.Host {
			t.Fatalf("%q became %q (host %q)", raw, tg.URL, tg.Host)
		}
		m, mapped := p.Hosts[tg.Host]
		if mapped && !m.Allows(tg.Port) || !mapped && (tg.Port != 443 || u.Scheme != "https") {
			t.Fatalf("%q accepted on port %d", raw, tg.Port)
		}
	})
}

// TestCallbackDenyRanges: SANDBOX_EGRESS_DENY_CIDRS holds for callbacks
// as for the proxy's connections.
func TestCallbackDenyRanges(t *testing.T) {
	p := testPolicy(t)
	deny, err := egress.ParseRanges("93.184.216.0/24")
	if err != nil {
		t.Fatal(err)
	}
	p.Deny = deny
	_, err = p.Check(context.Background(), "https://hooks.example/", clientDomains)
	if err == nil || !strings.Contains(runbox.ErrorMessage(err), "SANDBOX_EGRESS_DENY_CIDRS") {
		t.Fatalf("a callback into a denied range: %v", err)
	}
}

// countingResolver resolves every name to a public address, counting
// the lookups of each and the most under way at once.
type countingResolver struct {
	mu          sync.Mutex
	calls       map[string]int
	now, atOnce int
}

func (r *countingResolver) LookupNetIP(_ context.Context, _, host string) ([]netip.Addr, error) {
	r.mu.Lock()
	r.calls[host]++
	r.now++
	r.atOnce = max(r.atOnce, r.now)
	r.mu.Unlock()
	time.Sleep(5 * time.Millisecond)
	r.mu.Lock()
	r.now--
	r.mu.Unlock()
	return []netip.Addr{netip.MustParseAddr("93.184.216.34")}, nil
}

// TestCallbacksTogether: a request's callbacks are checked together —
// each host resolved once, a few at a time — and a host past the first
// MaxCallbackHosts is refused unresolved.
func TestCallbacksTogether(t *testing.T) {
	r := &countingResolver{calls: map[string]int{}}
	p := testPolicy(t)
	p.Resolver = r
	secrets, err := signature.Parse([]string{newSecret})
	if err != nil {
		t.Fatal(err)
	}
	svc := New(nil, nil, Options{Policy: p, Clients: map[string]Client{"alice": {Secrets: secrets}}})
	var urls []string
	for i := range 300 {
		urls = append(urls, fmt.Sprintf("https://h%d.sub.example/hook?run=%d", i%(MaxCallbackHosts+8), i))
	}
	urls = append(urls, "https://127.0.0.1/")
	cbs, errs := svc.Callbacks(context.Background(), "alice", urls)
	for i, u := range urls[:len(urls)-1] {
		host := i % (MaxCallbackHosts + 8)
		switch {
		case host < MaxCallbackHosts && (errs[i] != nil || cbs[i].URL != u):
			t.Errorf("%s: %+v, %v", u, cbs[i], errs[i])
		case host >= MaxCallbackHosts && (errs[i] == nil || !strings.Contains(runbox.ErrorMessage(errs[i]), "more than 32 hosts")):
			t.Errorf("%s, past the first %d hosts: %+v, %v", u, MaxCallbackHosts, cbs[i], errs[i])
		}
	}
	if err := errs[len(urls)-1]; runbox.ErrorCode(err) != runbox.EInvalid {
		t.Errorf("an address literal among them: %v", err)
	}
	if len(r.calls) != MaxCallbackHosts || r.atOnce > resolveAtOnce {
		t.Errorf("resolved %d hosts, %d at once; want %d, at most %d", len(r.calls), r.atOnce, MaxCallbackHosts, resolveAtOnce)
	}
	for h, n := range r.calls {
		if n != 1 {
			t.Errorf("%s resolved %d times", h, n)
		}
	}
	if _, errs := svc.Callbacks(context.Background(), "nobody", urls[:1]); errs[0] == nil {
		t.Error("a client without a secret was given a callback")
	}
}
