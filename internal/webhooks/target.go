package webhooks

import (
	"context"
	"net"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/runbox-dev/runbox"
	"github.com/runbox-dev/runbox/internal/egress"
)

// A callback URL names where a client's receiver listens, and runbox
// POSTs there from inside the operator's network: it must not become a
// way to reach what the client could not (the cloud's metadata service,
// the api's own port, a database on the private network). So a callback
// names a host, never an address in any of its forms; the host is one
// the client was given (webhook_domains) or the operator allows
// (WEBHOOK_ALLOW); it is reached over https on 443, or as WEBHOOK_HOSTS
// maps it (plain http allowed, on the mapped port only); and every address
// it resolves to passes the egress proxy's own checks (egress.Resolve),
// at submit time and again at each connection, which dials the address
// it checked. Redirects are not followed.

// maxURL bounds a callback URL.
const maxURL = 2048

// resolveTimeout bounds the resolution of a callback's host, and of all
// the hosts one request's callbacks name together (Service.Callbacks).
const resolveTimeout = 5 * time.Second

// Policy is where callbacks may go.
type Policy struct {
	// Allow are the hosts any client's callbacks may go to
	// (WEBHOOK_ALLOW), besides its own webhook_domains.
	Allow egress.Patterns
	// Hosts are names resolved to fixed addresses (WEBHOOK_HOSTS): the
	// only way a callback reaches a private or loopback address, on the
	// mapped port only, and the only names plain http may go to.
	Hosts egress.Hosts
	// Deny are ranges no callback reaches besides those the egress
	// proxy's rules refuse: the proxy's own (SANDBOX_EGRESS_DENY_CIDRS).
	Deny egress.Ranges
	// Resolver resolves other names (net.DefaultResolver if nil).
	Resolver egress.Resolver
	// Own returns the host's own addresses (egress.OwnAddresses if nil).
	Own func() map[netip.Addr]bool
}

// Target is a callback URL as checked.
type Target struct {
	// URL is the URL as it will be requested: scheme and host in lower
	// case, without a trailing dot.
	URL  string
	Host string
	Port uint16
}

// refused is a callback URL the policy does not accept.
func refused(format string, args ...any) error {
	return runbox.Errorf(runbox.EInvalid, "callback_url: "+format, args...)
}

// Parse checks what can be told of a callback URL without resolving its
// host, for a client whose own hosts are domains.
func (p *Policy) Parse(raw string, domains egress.Patterns) (Target, error) {
	if len(raw) > maxURL {
		return Target{}, refused("longer than %d bytes", maxURL)
	}
	if strings.ContainsFunc(raw, func(r rune) bool { return r <= ' ' || r == 0x7f || r == '\\' }) {
		return Target{}, refused("holds spaces, control characters or a backslash")
	}
	u, err := url.Parse(raw)
	if err != nil || !u.IsAbs() || u.Opaque != "" || u.Host == "" {
		return Target{}, refused("not an absolute http(s) URL")
	}
	scheme := strings.ToLower(u.Scheme)
	switch {
	case scheme != "https" && scheme != "http":
		return Target{}, refused("the scheme must be https")
	case u.User != nil:
		return Target{}, refused("a user name or password in the URL is not accepted")
	case u.Fragment != "" || u.RawFragment != "" || strings.Contains(raw, "#"):
		return Target{}, refused("a fragment (#…) is not sent with a request; leave it out")
	}
	host := u.Hostname()
	if strings.ContainsFunc(host, func(r rune) bool { return r >= 0x80 }) {
		return Target{}, refused("write the host's name in ASCII (its punycode form)")
	}
	name := egress.NormalizeHost(host)
	if _, err := netip.ParseAddr(name); err == nil || strings.Contains(name, ":") {
		return Target{}, refused("an address literal: callbacks must name a host")
	}
	if !egress.IsHostName(name) {
		return Target{}, refused("%q is not a host name", clip(host))
	}
	port := uint16(443)
	if scheme == "http" {
		port = 80
	}
	if ps := u.Port(); ps != "" {
		n, err := strconv.ParseUint(ps, 10, 16)
		if err != nil || n == 0 {
			return Target{}, refused("a bad port")
		}
		port = uint16(n)
	}
	m, mapped := p.Hosts[name]
	switch {
	case scheme == "http" && !mapped:
		return Target{}, refused("the scheme must be https (plain http goes only to the names WEBHOOK_HOSTS maps)")
	case mapped && !m.Allows(port):
		return Target{}, refused("port %d is not the port WEBHOOK_HOSTS gives %s", port, name)
	case !mapped && port != 443:
		return Target{}, refused("port %d: callbacks to names resolved through DNS go to port 443", port)
	case !p.Allow.Match(name) && !domains.Match(name):
		return Target{}, refused("%s is not among the hosts this client's callbacks may go to (its webhook_domains, WEBHOOK_ALLOW)", name)
	}
	explicit := u.Port()
	u.Scheme, u.Host = scheme, name
	if explicit != "" {
		u.Host = net.JoinHostPort(name, explicit)
	}
	return Target{URL: u.String(), Host: name, Port: port}, nil
}

// Resolve returns the addresses t may be reached at, or why none.
func (p *Policy) Resolve(ctx context.Context, t Target) ([]netip.AddrPort, error) {
	r := p.Resolver
	if r == nil {
		r = net.DefaultResolver
	}
	var own map[netip.Addr]bool
	if p.Own != nil {
		own = p.Own()
	} else {
		own, _ = egress.OwnAddresses()
	}
	rctx, cancel := context.WithTimeout(ctx, resolveTimeout)
	defer cancel()
	addrs, why := egress.Resolve(rctx, r, p.Hosts, own, p.Deny, t.Host, t.Port)
	if why != "" {
		return nil, refused("%s: %s", t.Host, why)
	}
	return addrs, nil
}

// resolveAll resolves targets — distinct hosts — resolveAtOnce at a time,
// all within one resolveTimeout, and returns why each was refused (nil:
// it resolved to addresses it may lead to).
func (p *Policy) resolveAll(ctx context.Context, targets []Target) []error {
	errs := make([]error, len(targets))
	ctx, cancel := context.WithTimeout(ctx, resolveTimeout)
	defer cancel()
	places := make(chan struct{}, resolveAtOnce)
	var wg sync.WaitGroup
	late := func(t Target) error {
		return refused("%s: not resolved in time (a request's callbacks have %v together)", t.Host, resolveTimeout)
	}
	for i, t := range targets {
		select {
		case places <- struct{}{}:
		case <-ctx.Done():
			errs[i] = late(t)
			continue
		}
		wg.Go(func() {
			defer func() { <-places }()
			if _, errs[i] = p.Resolve(ctx, t); errs[i] != nil && ctx.Err() != nil {
				errs[i] = late(t)
			}
		})
	}
	wg.Wait()
	return errs
}

// Check checks a callback URL entirely, its host resolved, for a client
// whose own hosts are domains, and returns it as it will be requested.
func (p *Policy) Check(ctx context.Context, raw string, domains egress.Patterns) (string, error) {
	t, err := p.Parse(raw, domains)
	if err != nil {
		return "", err
	}
	if _, err := p.Resolve(ctx, t); err != nil {
		return "", err
	}
	return t.URL, nil
}

func clip(s string) string {
	if len(s) > 80 {
		return s[:80] + "…"
	}
	return s
}
