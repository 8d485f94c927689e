// Package egress is what a run may reach outside its sandbox, and the
// proxy through which it does (proxy.go). The operator allows domain
// patterns (SANDBOX_EGRESS_ALLOW, a tier's egress_domains); a run asks for
// names within them (network.allowed_domains); the proxy decides each
// connection by the name asked for, resolves it itself and dials only an
// address it checked. Names may lead to private, loopback or link-local
// addresses only through SANDBOX_EGRESS_HOSTS, and then to one port.
package egress

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"github.com/runbox-dev/runbox"
)

// Pattern is a domain name ("pypi.org") or every name below one
// ("*.pythonhosted.org", which does not match pythonhosted.org itself).
type Pattern struct {
	name     string
	wildcard bool
}

// ParsePattern reads a pattern; names are lower-cased, a trailing dot
// dropped.
func ParsePattern(s string) (Pattern, error) {
	s = strings.TrimSuffix(strings.ToLower(strings.TrimSpace(s)), ".")
	p := Pattern{name: s}
	if rest, ok := strings.CutPrefix(s, "*."); ok {
		p = Pattern{name: rest, wildcard: true}
	}
	if !IsHostName(p.name) {
		return Pattern{}, fmt.Errorf("%q is not a domain name or *.domain pattern", truncate(s))
	}
	return p, nil
}

func (p Pattern) String() string {
	if p.wildcard {
		return "*." + p.name
	}
	return p.name
}

// Match reports whether host (a name as NormalizeHost leaves it) is one
// the pattern names.
func (p Pattern) Match(host string) bool {
	if p.wildcard {
		return strings.HasSuffix(host, "."+p.name)
	}
	return host == p.name
}

// Covers reports whether every name q matches, p matches too.
func (p Pattern) Covers(q Pattern) bool {
	if !p.wildcard {
		return !q.wildcard && q.name == p.name
	}
	return q.name == p.name && q.wildcard || strings.HasSuffix(q.name, "."+p.name)
}

// Patterns is a list of patterns: an allowlist, or what a run asked for.
type Patterns []Pattern

// ParsePatterns reads a list of patterns.
func ParsePatterns(list []string) (Patterns, error) {
	out := make(Patterns, 0, len(list))
	for _, s := range list {
		p, err := ParsePattern(s)
		if err != nil {
			return nil, err
		}
		if !slices.Contains(out, p) {
			out = append(out, p)
		}
	}
	return out, nil
}

// ParseList reads comma-separated patterns (SANDBOX_EGRESS_ALLOW).
func ParseList(s string) (Patterns, error) {
	var list []string
	for item := range strings.SplitSeq(s, ",") {
		if item = strings.TrimSpace(item); item != "" {
			list = append(list, item)
		}
	}
	return ParsePatterns(list)
}

// Match reports whether any pattern matches host.
func (ps Patterns) Match(host string) bool {
	return slices.ContainsFunc(ps, func(p Pattern) bool { return p.Match(host) })
}

// Covers reports whether a pattern of the list covers q.
func (ps Patterns) Covers(q Pattern) bool {
	return slices.ContainsFunc(ps, func(p Pattern) bool { return p.Covers(q) })
}

// Strings returns the patterns as written.
func (ps Patterns) Strings() []string {
	out := make([]string, len(ps))
	for i, p := range ps {
		out[i] = p.String()
	}
	return out
}

// maxAsked bounds the domains one run may ask for.
const maxAsked = 64

// Admit checks what a run asks for against an allowlist: every domain must
// be one the list covers, or the answer is egress_denied naming it.
func (ps Patterns) Admit(asked []string) (Patterns, error) {
	if len(asked) > maxAsked {
		return nil, runbox.Errorf(runbox.EInvalid, "network.allowed_domains has %d entries; the limit is %d", len(asked), maxAsked)
	}
	out := make(Patterns, 0, len(asked))
	for _, s := range asked {
		p, err := ParsePattern(s)
		if err != nil {
			return nil, runbox.Errorf(runbox.EInvalid, "network.allowed_domains: %v", err)
		}
		if !ps.Covers(p) {
			return nil, runbox.Errorf(runbox.EEgressDenied, "%s is not among the domains this client may reach", p)
		}
		out = append(out, p)
	}
	return out, nil
}

// NormalizeHost lower-cases a host and drops a trailing dot and the
// brackets of an IPv6 literal.
func NormalizeHost(h string) string {
	h = strings.TrimSuffix(strings.TrimPrefix(h, "["), "]")
	return strings.TrimSuffix(strings.ToLower(h), ".")
}

// IsHostName reports whether s is a DNS name: dot-separated labels of
// letters, digits and inner hyphens, the last not all digits (so that
// no form of an address, "127.1" or "0x7f.1", passes for a name).
func IsHostName(s string) bool {
	if s == "" || len(s) > 253 {
		return false
	}
	labels := strings.Split(s, ".")
	for _, l := range labels {
		if l == "" || len(l) > 63 || l[0] == '-' || l[len(l)-1] == '-' {
			return false
		}
		for _, r := range l {
			if !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '-') {
				return false
			}
		}
	}
	last := labels[len(labels)-1]
	if _, err := strconv.ParseUint(last, 0, 64); err == nil {
		return false
	}
	return strings.ContainsFunc(last, func(r rune) bool { return r >= 'a' && r <= 'z' })
}

// Mapping is where SANDBOX_EGRESS_HOSTS sends a name: an address, and the
// one port it may be reached on (0: 80 and 443).
type Mapping struct {
	Addr netip.Addr
	Port uint16
}

// Allows reports whether a connection to port may use the mapping.
func (m Mapping) Allows(port uint16) bool {
	if m.Port != 0 {
		return port == m.Port
	}
	return port == 80 || port == 443
}

// Hosts are the names the proxy resolves itself, by name.
type Hosts map[string]Mapping

// ParseHosts reads SANDBOX_EGRESS_HOSTS: "name=address[:port],…", the
// address an IP (an IPv6 one in brackets when a port follows).
func ParseHosts(s string) (Hosts, error) {
	h := Hosts{}
	for entry := range strings.SplitSeq(s, ",") {
		entry = strings.TrimSpace(entry)
		if entry == "" {
			continue
		}
		name, target, ok := strings.Cut(entry, "=")
		name = NormalizeHost(strings.TrimSpace(name))
		if !ok || !IsHostName(name) {
			return nil, fmt.Errorf("%q must be name=address[:port] with a domain name", truncate(entry))
		}
		m, err := parseTarget(strings.TrimSpace(target))
		if err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
		h[name] = m
	}
	return h, nil
}

func parseTarget(t string) (Mapping, error) {
	if ap, err := netip.ParseAddrPort(t); err == nil {
		if ap.Port() == 0 {
			return Mapping{}, errors.New("port 0")
		}
		return Mapping{Addr: ap.Addr().Unmap(), Port: ap.Port()}, nil
	}
	a, err := netip.ParseAddr(strings.TrimSuffix(strings.TrimPrefix(t, "["), "]"))
	if err != nil {
		return Mapping{}, fmt.Errorf("%q is not an IP address with an optional port", truncate(t))
	}
	return Mapping{Addr: a.Unmap()}, nil
}

// Ranges are address ranges: those SANDBOX_EGRESS_DENY_CIDRS refuses.
type Ranges []netip.Prefix

// ParseRanges reads comma-separated CIDRs (an address alone is a range
// of one).
func ParseRanges(s string) (Ranges, error) {
	var out Ranges
	for item := range strings.SplitSeq(s, ",") {
		if item = strings.TrimSpace(item); item == "" {
			continue
		}
		p, err := netip.ParsePrefix(item)
		if err != nil {
			a, aerr := netip.ParseAddr(item)
			if aerr != nil {
				return nil, fmt.Errorf("%q is not a CIDR (10.0.0.0/8, 2001:db8::/32) or an address", truncate(item))
			}
			p = netip.PrefixFrom(a.Unmap(), a.Unmap().BitLen())
		}
		if p.Addr().Is4In6() {
			p = netip.PrefixFrom(p.Addr().Unmap(), max(p.Bits()-96, 0))
		}
		out = append(out, p.Masked())
	}
	return out, nil
}

// Contains reports whether a is in one of the ranges.
func (rs Ranges) Contains(a netip.Addr) bool {
	a = a.Unmap().WithZone("")
	return slices.ContainsFunc(rs, func(p netip.Prefix) bool { return p.Contains(a) })
}

// Resolver resolves names; *net.Resolver is one.
type Resolver interface {
	LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error)
}

// deniedRange is why an address in SANDBOX_EGRESS_DENY_CIDRS is refused.
const deniedRange = "an address in SANDBOX_EGRESS_DENY_CIDRS"

// Resolve returns the addresses host may be dialled at on port, or why
// none: a name hosts maps goes to its address (the caller holds it to
// the mapping's port) unless deny holds it; any other is resolved by r,
// and a single address it resolves to that Forbidden names, or that deny
// holds, refuses it. Callers dial the addresses returned, never the name,
// so that what was checked is what is reached (no second resolution for
// a rebinding name to change). Everything that leaves the service for a
// name a client chose — the egress proxy's connections, webhooks — goes
// through here.
func Resolve(ctx context.Context, r Resolver, hosts Hosts, own map[netip.Addr]bool, deny Ranges, host string, port uint16) ([]netip.AddrPort, string) {
	if m, ok := hosts[host]; ok {
		if deny.Contains(m.Addr) {
			return nil, "the name is mapped to " + deniedRange
		}
		return []netip.AddrPort{netip.AddrPortFrom(m.Addr, port)}, ""
	}
	ips, err := r.LookupNetIP(ctx, "ip", host)
	if err != nil || len(ips) == 0 {
		return nil, "the name does not resolve"
	}
	out := make([]netip.AddrPort, 0, len(ips))
	for _, ip := range ips {
		// One address it may not lead to refuses the name: its owner
		// decides what it resolves to, and when.
		why := Forbidden(ip, own)
		if why == "" && deny.Contains(ip) {
			why = deniedRange
		}
		if why != "" {
			return nil, "the name resolves to " + why
		}
		out = append(out, netip.AddrPortFrom(ip.Unmap(), port))
	}
	return out, ""
}

// OwnAddresses returns the addresses of the host's interfaces, which no
// name resolved through DNS may lead to (Forbidden's own).
func OwnAddresses() (map[netip.Addr]bool, error) {
	own := map[netip.Addr]bool{}
	addrs, err := net.InterfaceAddrs()
	for _, a := range addrs {
		if pfx, err := netip.ParsePrefix(a.String()); err == nil {
			own[pfx.Addr().Unmap().WithZone("")] = true
		}
	}
	return own, err
}

// reserved are the ranges no name resolved through DNS may lead to,
// beyond what netip's predicates name: every entry of IANA's IPv4 and
// IPv6 Special-Purpose Address Registries that is not globally reachable
// (shared address space, IETF protocol assignments, benchmarking,
// documentation, the deprecated 6to4 relay anycast, reserved, discard-only,
// the dummy prefix, segment routing), and the IPv6 prefixes that embed an
// IPv4 address (NAT64, 6to4, Teredo). IPv6 outside global unicast
// (2000::/3) is refused before these are looked at (Forbidden): that
// covers the IPv4-compatible ::/96, the IPv4-translated ::ffff:0:0:0/96,
// the discard-only 100::/64, 5f00::/16 and the site-local fec0::/10.
var reserved = []netip.Prefix{
	netip.MustParsePrefix("0.0.0.0/8"),
	netip.MustParsePrefix("100.64.0.0/10"),
	netip.MustParsePrefix("192.0.0.0/24"),
	netip.MustParsePrefix("192.0.2.0/24"),
	netip.MustParsePrefix("192.88.99.0/24"),
	netip.MustParsePrefix("198.18.0.0/15"),
	netip.MustParsePrefix("198.51.100.0/24"),
	netip.MustParsePrefix("203.0.113.0/24"),
	netip.MustParsePrefix("240.0.0.0/4"),
	netip.MustParsePrefix("2001::/23"),
	netip.MustParsePrefix("2001:db8::/32"),
	netip.MustParsePrefix("2002::/16"),
	netip.MustParsePrefix("3fff::/20"),
}

// globalUnicast6 is the IPv6 space IANA allocates for global unicast: no
// name may lead to an IPv6 address outside it (IPv4-mapped ones are
// judged as the IPv4 address they carry).
var globalUnicast6 = netip.MustParsePrefix("2000::/3")

// Forbidden says why a name resolved through DNS may not lead to a, or ""
// when it may. own holds the host's own addresses.
func Forbidden(a netip.Addr, own map[netip.Addr]bool) string {
	a = a.Unmap().WithZone("")
	switch {
	case a.IsLoopback():
		return "a loopback address"
	case a.IsLinkLocalUnicast() || a.IsLinkLocalMulticast():
		return "a link-local address"
	case a.IsPrivate():
		return "a private address"
	case own[a]:
		return "an address of the runbox host"
	case a.IsUnspecified() || a.IsMulticast() || !a.IsGlobalUnicast() || a.Is6() && !globalUnicast6.Contains(a):
		return "an address that is not a public one"
	}
	for _, p := range reserved {
		if p.Contains(a) {
			return "a reserved address"
		}
	}
	return ""
}

func truncate(s string) string {
	if len(s) > 80 {
		return s[:80] + "…"
	}
	return s
}
