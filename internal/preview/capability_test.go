package preview

import (
	"strings"
	"testing"
	"time"
)

func TestCapability(t *testing.T) {
	s := NewSigner([]byte("0123456789abcdef0123456789abcdef"))
	now := time.Unix(1_800_000_000, 0)
	id := [idLen]byte{1, 2, 3, 4, 5, 6, 7, 8, 9, 10}
	label := s.Sign(id, 8000, now.Add(time.Hour), "default", "conv1")
	if len(label) != LabelLen || len(label) > 63 || strings.ToLower(label) != label {
		t.Fatalf("label %q is not one lower-case DNS label of %d", label, LabelLen)
	}
	c, err := s.Parse(label, now)
	if err != nil {
		t.Fatal(err)
	}
	if c.Port != 8000 || c.ID != id || !c.Expires.Equal(now.Add(time.Hour)) {
		t.Errorf("parsed %+v", c)
	}
	if !s.Verify(c, "default", "conv1") {
		t.Error("a capability does not verify for its own conversation")
	}
	for _, tc := range []struct{ client, conv string }{{"default", "conv2"}, {"other", "conv1"}, {"default", "conv1\x00"}} {
		if s.Verify(c, tc.client, tc.conv) {
			t.Errorf("verifies for %q %q", tc.client, tc.conv)
		}
	}
	other := NewSigner([]byte("another key of thirty-two bytes!"))
	if _, err := other.Parse(label, now); err == nil || other.Verify(c, "default", "conv1") {
		t.Error("parses or verifies under another key")
	}
	if _, err := s.Parse(label, now.Add(time.Hour)); err == nil {
		t.Error("parses at its expiry")
	}
	if c2, err := s.Parse(strings.ToUpper(label), now); err != nil || c2 != c {
		t.Error("host names are not case-sensitive; the label must not be either")
	}
}

// TestAlteredCapabilities changes each part of a label: none of the
// results is accepted as a capability of the conversation.
func TestAlteredCapabilities(t *testing.T) {
	s := NewSigner([]byte("0123456789abcdef0123456789abcdef"))
	now := time.Unix(1_800_000_000, 0)
	id := [idLen]byte{9, 9, 9}
	label := s.Sign(id, 8000, now.Add(time.Hour), "default", "conv1")
	accepted := func(l string) bool {
		c, err := s.Parse(l, now)
		return err == nil && s.Verify(c, "default", "conv1")
	}
	// Every single character changed to every other.
	for i := range label {
		for _, r := range "abcdefghijklmnopqrstuvwxyz234567" {
			if byte(r) == label[i] {
				continue
			}
			if l := label[:i] + string(r) + label[i+1:]; accepted(l) {
				t.Fatalf("altered label %q accepted", l)
			}
		}
	}
	// Another port, a later expiry, another record: each re-signed with
	// the wrong key is refused.
	forger := NewSigner([]byte("not the service's key, 32 bytes."))
	for _, l := range []string{
		forger.Sign(id, 8001, now.Add(time.Hour), "default", "conv1"),
		forger.Sign(id, 8000, now.Add(48*time.Hour), "default", "conv1"),
		forger.Sign([idLen]byte{1}, 8000, now.Add(time.Hour), "default", "conv1"),
		label[:LabelLen-1], label + "a", "", strings.Repeat("a", LabelLen),
	} {
		if accepted(l) {
			t.Errorf("%q accepted", l)
		}
	}
}

func FuzzParse(f *testing.F) {
	s := NewSigner([]byte("0123456789abcdef0123456789abcdef"))
	now := time.Unix(1_800_000_000, 0)
	seed := s.Sign([idLen]byte{1}, 3000, now.Add(time.Hour), "c", "x")
	f.Add(seed)
	f.Add(strings.Repeat("7", LabelLen))
	f.Add("")
	f.Add("aaaa.bbbb")
	f.Fuzz(func(t *testing.T, label string) {
		c, err := s.Parse(label, now)
		if err != nil {
			return
		}
		// What parses is exactly what Sign makes: one label per
		// capability, a port, a future expiry.
		if len(label) != LabelLen || c.Port < 1 || c.Port > 65535 || !c.Expires.After(now) {
			t.Fatalf("parsed %q as %+v", label, c)
		}
		// Only the head of the seed Sign made gets past the head tag, and
		// only the seed itself verifies.
		if c.ID != [idLen]byte{1} || c.Port != 3000 || s.Verify(c, "c", "x") && strings.ToLower(label) != seed {
			t.Fatalf("a fuzzed label parses: %q (%+v)", label, c)
		}
	})
}

func TestDomain(t *testing.T) {
	d, err := ParseDomain("localhost:8080", "http")
	if err != nil {
		t.Fatal(err)
	}
	label := strings.Repeat("a", LabelLen)
	if u := d.URL(label); u != "http://"+label+".localhost:8080/" {
		t.Errorf("URL %s", u)
	}
	for _, tc := range []struct {
		host    string
		label   string
		preview bool
	}{
		{label + ".localhost:8080", label, true},
		{strings.ToUpper(label) + ".LOCALHOST:8080", label, true},
		{label + ".localhost", label, true},
		{label + ".localhost.:9999", label, true},
		{"a.b.localhost:8080", "", true},
		{"localhost:8080", "", false},
		{"127.0.0.1:8080", "", false},
		{"evillocalhost:8080", "", false},
		{"[::1]:8080", "", false},
		{"", "", false},
	} {
		label, preview := d.Match(tc.host)
		if label != tc.label || preview != tc.preview {
			t.Errorf("Match(%q) = %q, %v", tc.host, label, preview)
		}
	}
	if d2, _ := ParseDomain("preview.example.com", "https"); d2.URL("x") != "https://x.preview.example.com/" ||
		d2.Under("api.example.com") || !d2.Under("x.preview.example.com:443") || d2.Under("preview.example.com") {
		t.Error("preview.example.com")
	}
	for _, bad := range []string{"", "127.0.0.1", "exa mple.com", "-a.com", "a..b", strings.Repeat("a.", 110) + "com"} {
		if _, err := ParseDomain(bad, "http"); err == nil {
			t.Errorf("ParseDomain(%q) accepted", bad)
		}
	}
	if _, err := ParseDomain("localhost", "ftp"); err == nil {
		t.Error("ftp accepted")
	}
}
