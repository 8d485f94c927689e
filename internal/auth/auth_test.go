package auth

import (
	"context"
	"testing"

	"github.com/runbox-dev/runbox/internal/clients"
)

func TestTokens(t *testing.T) {
	cs, err := clients.Load("", "alice:alice-token-1:free,bob:bob-token-22", "")
	if err != nil {
		t.Fatal(err)
	}
	tokens := NewTokens(cs)
	tests := []struct {
		token, name, tier string
		ok                bool
	}{
		{"alice-token-1", "alice", "free", true},
		{"bob-token-22", "bob", "unlimited", true},
		{"alice-token-", "", "", false},
		{"alice-token-12", "", "", false},
		{"", "", "", false},
	}
	for _, tt := range tests {
		c, ok := tokens.Check(tt.token)
		if c.Name != tt.name || c.Tier.Name != tt.tier || ok != tt.ok {
			t.Errorf("Check(%q) = %+v, %v; want %q (%s), %v", tt.token, c, ok, tt.name, tt.tier, tt.ok)
		}
	}
	alice, _ := tokens.Check("alice-token-1")
	ctx := WithClient(context.Background(), alice)
	if Client(ctx) != "alice" || Tier(ctx).CallsPerMinute != 10 || Client(context.Background()) != "" {
		t.Error("the client does not travel in the context")
	}
}
