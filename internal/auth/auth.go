// Package auth checks the API tokens clients present and carries the
// client through a request's context.
package auth

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"

	"github.com/runbox-dev/runbox/internal/clients"
)

// Tokens are the accepted API tokens and their clients.
type Tokens struct {
	clients clients.Clients
}

// NewTokens accepts the tokens of cs.
func NewTokens(cs clients.Clients) *Tokens { return &Tokens{clients: cs} }

// Check returns the client a token belongs to. It compares the token's
// digest with every configured one in constant time, so neither the
// position nor a prefix of a token leaks through timing.
func (t *Tokens) Check(token string) (clients.Client, bool) {
	if token == "" {
		return clients.Client{}, false
	}
	d := sha256.Sum256([]byte(token))
	var found clients.Client
	ok := false
	for k, c := range t.clients {
		if subtle.ConstantTimeCompare(d[:], k[:]) == 1 {
			found, ok = c, true
		}
	}
	return found, ok
}

type clientKey struct{}

// WithClient returns ctx carrying the client.
func WithClient(ctx context.Context, c clients.Client) context.Context {
	return context.WithValue(ctx, clientKey{}, c)
}

// Client returns the name of the authenticated client of ctx, or "".
func Client(ctx context.Context) string {
	c, _ := ctx.Value(clientKey{}).(clients.Client)
	return c.Name
}

// Tier returns the tier of the authenticated client of ctx; the zero Tier
// (no limits) when there is none (stdio).
func Tier(ctx context.Context) clients.Tier {
	c, _ := ctx.Value(clientKey{}).(clients.Client)
	return c.Tier
}
