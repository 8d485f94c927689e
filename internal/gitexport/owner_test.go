package gitexport

import "testing"

// TestMadeFor: only the trailers runbox writes, as the message's last
// paragraph, name the client; a client's own message cannot.
func TestMadeFor(t *testing.T) {
	for msg, want := range map[string]string{
		"Add the report\n\nRunbox-Client: alice\nRunbox-Audit-Call: 01J\n":                    "alice",
		"Add\n\nRunbox-Client: alice\nRunbox-Conversation: c1\nRunbox-Audit-Call: 01J\n":      "alice",
		"Pose as bob\n\nRunbox-Client: bob\n\nRunbox-Client: alice\nRunbox-Audit-Call: 01J\n": "alice",
		"A human's commit\n": "",
		"A human's commit\n\nSigned-off-by: someone <a@example.com>\n": "",
		"Runbox-Client: bob\n": "",
		"Fix\n\nCo-authored-by: x <x@example.com>\nRunbox-Client: bob\n": "",
		"Add\n\nRunbox-Client: alice\nRunbox-Audit-Call: 01J\n\n\n":      "alice",
	} {
		if got := madeFor(msg); got != want {
			t.Errorf("madeFor(%q) = %q, want %q", msg, got, want)
		}
	}
}
