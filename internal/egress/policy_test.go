package egress

import (
	"net/netip"
	"testing"

	"github.com/runbox-dev/runbox"
)

func TestParsePattern(t *testing.T) {
	for _, tt := range []struct {
		in, want string
		ok       bool
	}{
		{"pypi.org", "pypi.org", true},
		{" PyPI.org. ", "pypi.org", true},
		{"*.pythonhosted.org", "*.pythonhosted.org", true},
		{"localhost", "localhost", true},
		{"*", "", false},
		{"*.", "", false},
		{"a.*.org", "", false},
		{"127.0.0.1", "", false},
		{"127.1", "", false},
		{"0x7f.1", "", false},
		{"::1", "", false},
		{"-a.org", "", false},
		{"a_b.org", "", false},
		{"", "", false},
	} {
		p, err := ParsePattern(tt.in)
		if (err == nil) != tt.ok || (tt.ok && p.String() != tt.want) {
			t.Errorf("ParsePattern(%q) = %v, %v; want %q (ok %v)", tt.in, p, err, tt.want, tt.ok)
		}
	}
}

func TestPatternsMatchAndCover(t *testing.T) {
	allow, err := ParseList("pypi.org, *.pythonhosted.org,files.test")
	if err != nil {
		t.Fatal(err)
	}
	for host, want := range map[string]bool{
		"pypi.org": true, "www.pypi.org": false, "files.pythonhosted.org": true, "a.b.pythonhosted.org": true,
		"pythonhosted.org": false, "evilpythonhosted.org": false, "files.test": true, "x.files.test": false,
	} {
		if got := allow.Match(host); got != want {
			t.Errorf("Match(%q) = %v", host, got)
		}
	}
	for asked, want := range map[string]bool{
		"pypi.org": true, "files.pythonhosted.org": true, "*.pythonhosted.org": true, "*.a.pythonhosted.org": true,
		"*.pypi.org": false, "pythonhosted.org": false, "example.com": false, "*.org": false,
	} {
		p, _ := ParsePattern(asked)
		if got := allow.Covers(p); got != want {
			t.Errorf("Covers(%q) = %v", asked, got)
		}
	}
}

func TestAdmit(t *testing.T) {
	allow, _ := ParseList("pypi.org,*.example.com")
	if got, err := allow.Admit([]string{"PYPI.org", "a.example.com"}); err != nil || len(got) != 2 {
		t.Fatalf("Admit = %v, %v", got, err)
	}
	for asked, code := range map[string]string{
		"evil.com":    runbox.EEgressDenied,
		"example.com": runbox.EEgressDenied,
		"10.0.0.1":    runbox.EInvalid,
		"*":           runbox.EInvalid,
	} {
		_, err := allow.Admit([]string{"pypi.org", asked})
		if runbox.ErrorCode(err) != code {
			t.Errorf("Admit(%q) = %v, want %s", asked, err, code)
		}
	}
	if _, err := Patterns(nil).Admit([]string{"pypi.org"}); runbox.ErrorCode(err) != runbox.EEgressDenied {
		t.Errorf("an empty allowlist admitted: %v", err)
	}
}

func TestParseHosts(t *testing.T) {
	h, err := ParseHosts("pypi.internal=10.0.0.5:8080, mirror.test = 127.0.0.1 ,v6.test=[::1]:81")
	if err != nil {
		t.Fatal(err)
	}
	want := Hosts{
		"pypi.internal": {netip.MustParseAddr("10.0.0.5"), 8080},
		"mirror.test":   {netip.MustParseAddr("127.0.0.1"), 0},
		"v6.test":       {netip.MustParseAddr("::1"), 81},
	}
	if len(h) != len(want) {
		t.Fatalf("got %v", h)
	}
	for k, v := range want {
		if h[k] != v {
			t.Errorf("%s: %v, want %v", k, h[k], v)
		}
	}
	if !h["mirror.test"].Allows(443) || h["mirror.test"].Allows(6379) || !h["pypi.internal"].Allows(8080) || h["pypi.internal"].Allows(80) {
		t.Error("ports of mappings")
	}
	for _, bad := range []string{"a", "a=", "10.0.0.1=10.0.0.2", "a.test=host.example", "a.test=10.0.0.1:0", "a.test=10.0.0.1:x"} {
		if _, err := ParseHosts(bad); err == nil {
			t.Errorf("ParseHosts(%q) accepted", bad)
		}
	}
}

func TestForbidden(t *testing.T) {
	own := map[netip.Addr]bool{netip.MustParseAddr("203.0.114.7"): true}
	for addr, want := range map[string]bool{
		"127.0.0.1": true, "127.9.9.9": true, "::1": true, "10.1.2.3": true, "172.16.0.1": true, "192.168.1.1": true,
		"169.254.169.254": true, "fe80::1": true, "fd00::1": true, "0.0.0.0": true, "::": true, "100.64.0.1": true,
		"224.0.0.1": true, "::ffff:127.0.0.1": true, "64:ff9b::7f00:1": true, "2002:7f00:1::": true, "203.0.114.7": true,
		"240.0.0.1": true, "255.255.255.255": true,
		// The rest of IANA's special-purpose registries: IPv4-compatible
		// (::/96), IPv4-translated (::ffff:0:0:0/96), discard-only,
		// dummy, segment routing, reserved IPv6 outside 2000::/3, IETF
		// protocol assignments (2001::/23), documentation (3fff::/20),
		// the 6to4 relay anycast, NAT64's local use.
		"::7f00:1": true, "::a00:1": true, "::5db8:d822": true, "::ffff:0:5db8:d822": true, "::ffff:0:7f00:1": true,
		"100::1": true, "100:0:0:1::1": true, "5f00::1": true, "4000::1": true, "fec0::1": true, "2001:2::1": true,
		"2001:10::1": true, "2001:20::1": true, "3fff::1": true, "3fff:fff:ffff::1": true, "192.88.99.1": true,
		"64:ff9b:1::1": true, "192.0.0.9": true,
		"1.1.1.1": false, "93.184.216.34": false, "2606:4700:4700::1111": false,
	} {
		if got := Forbidden(netip.MustParseAddr(addr), own) != ""; got != want {
			t.Errorf("Forbidden(%s) = %q", addr, Forbidden(netip.MustParseAddr(addr), own))
		}
	}
}

func TestParseRanges(t *testing.T) {
	rs, err := ParseRanges(" 203.0.113.7 ,198.51.100.0/24, 2001:db8::/32,::ffff:192.0.2.0/120,")
	if err != nil || len(rs) != 4 {
		t.Fatalf("%v %v", rs, err)
	}
	for a, want := range map[string]bool{
		"203.0.113.7": true, "203.0.113.8": false, "198.51.100.200": true, "::ffff:198.51.100.1": true,
		"2001:db8::1": true, "2001:db9::1": false, "192.0.2.9": true, "192.0.3.1": false,
	} {
		if got := rs.Contains(netip.MustParseAddr(a)); got != want {
			t.Errorf("Contains(%s) = %v", a, got)
		}
	}
	for _, bad := range []string{"10.0.0.0/33", "host.example", "10.0.0.0/8/8"} {
		if _, err := ParseRanges(bad); err == nil {
			t.Errorf("%q parsed", bad)
		}
	}
}
