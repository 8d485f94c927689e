package auth

import (
	"context"
	"testing"
)

func TestTokens(t *testing.T) {
	tokens := NewTokens(map[string]string{"alice-token-1": "alice", "bob-token-22": "bob"})
	tests := []struct {
		token, name string
		ok          bool
	}{
		{"alice-token-1", "alice", true},
		{"bob-token-22", "bob", true},
		{"alice-token-", "", false},
		{"alice-token-12", "", false},
		{"", "", false},
	}
	for _, tt := range tests {
		name, ok := tokens.Check(tt.token)
		if name != tt.name || ok != tt.ok {
			t.Errorf("Check(%q) = %q, %v; want %q, %v", tt.token, name, ok, tt.name, tt.ok)
		}
	}
	ctx := WithClient(context.Background(), "alice")
	if Client(ctx) != "alice" || Client(context.Background()) != "" {
		t.Error("client name does not travel in the context")
	}
}
