package runbox

import "testing"

func TestConversationKey(t *testing.T) {
	tests := []struct {
		client, id string
		key, url   string
		err        bool
	}{
		{"default", "demo", "demo", "demo", false},
		{"", "demo", "demo", "demo", false},
		{"alice", "demo", "~alice~demo", "~alice/demo", false},
		{"alice", "~bob~demo", "", "", true},
		{"alice", "a/b", "", "", true},
		{"default", "", "", "", true},
	}
	for _, tt := range tests {
		key, err := ConversationKey(tt.client, tt.id)
		if (err != nil) != tt.err || key != tt.key {
			t.Errorf("ConversationKey(%q, %q) = %q, %v", tt.client, tt.id, key, err)
			continue
		}
		if tt.err {
			continue
		}
		if got := ConversationURLPath(key); got != tt.url {
			t.Errorf("ConversationURLPath(%q) = %q, want %q", key, got, tt.url)
		}
		client, id, ok := ParseConversationKey(key)
		wantClient := tt.client
		if wantClient == "" {
			wantClient = DefaultClient
		}
		if !ok || client != wantClient || id != tt.id {
			t.Errorf("ParseConversationKey(%q) = %q, %q, %v", key, client, id, ok)
		}
	}
	for _, bad := range []string{"~default~x", "~a", "~~x", "~a~", "~a~b~c", "a~b", "", "~a b~c"} {
		if ValidConversationKey(bad) {
			t.Errorf("ValidConversationKey(%q) = true", bad)
		}
	}
}

func FuzzConversationKey(f *testing.F) {
	for _, s := range []string{"demo", "~alice~demo", "~a~b~c", "~default~x", "../x"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, key string) {
		client, id, ok := ParseConversationKey(key)
		if !ok {
			return
		}
		// A valid key is one of one client's ids, and a single path element.
		again, err := ConversationKey(client, id)
		if err != nil || again != key {
			t.Fatalf("%q parsed as %q/%q, which keys to %q (%v)", key, client, id, again, err)
		}
		for _, r := range key {
			if r == '/' || r == 0 || r == '.' {
				t.Fatalf("key %q is not a safe path element", key)
			}
		}
	})
}
