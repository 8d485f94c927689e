// Package auth checks the API tokens clients present and carries the
// client's name through a request's context.
package auth

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
)

// Tokens are the accepted API tokens and the names of their clients.
type Tokens struct {
	digests map[[32]byte]string
}

// NewTokens accepts the tokens of byToken (token → client name).
func NewTokens(byToken map[string]string) *Tokens {
	t := &Tokens{digests: make(map[[32]byte]string, len(byToken))}
	for tok, name := range byToken {
		t.digests[sha256.Sum256([]byte(tok))] = name
	}
	return t
}

// Check returns the name of the client a token belongs to. It compares
// digests of every configured token in constant time, so neither the
// position nor a prefix of a token leaks through timing.
func (t *Tokens) Check(token string) (string, bool) {
	if token == "" {
		return "", false
	}
	d := sha256.Sum256([]byte(token))
	name, found := "", false
	for k, n := range t.digests {
		if subtle.ConstantTimeCompare(d[:], k[:]) == 1 {
			name, found = n, true
		}
	}
	return name, found
}

type clientKey struct{}

// WithClient returns ctx carrying the client's name.
func WithClient(ctx context.Context, name string) context.Context {
	return context.WithValue(ctx, clientKey{}, name)
}

// Client returns the name of the authenticated client of ctx.
func Client(ctx context.Context) string {
	name, _ := ctx.Value(clientKey{}).(string)
	return name
}
