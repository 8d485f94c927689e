// Package signature signs webhooks as the Standard Webhooks specification
// says (https://www.standardwebhooks.com): the headers webhook-id,
// webhook-timestamp and webhook-signature, the last "v1,<base64 of
// HMAC-SHA256(secret, id.timestamp.body)>", one such per secret, space
// separated. A client's secret is "whsec_" and its base64; while a secret
// is rotated, two are valid at once and every webhook carries both
// signatures, so that a receiver holding either accepts it. The signing
// itself is the specification's own Go library's.
package signature

import (
	"encoding/base64"
	"fmt"
	"strconv"
	"strings"
	"time"

	standardwebhooks "github.com/standard-webhooks/standard-webhooks/libraries/go"
)

// The headers of a signed webhook.
const (
	HeaderID        = standardwebhooks.HeaderWebhookID
	HeaderTimestamp = standardwebhooks.HeaderWebhookTimestamp
	HeaderSignature = standardwebhooks.HeaderWebhookSignature
)

// Prefix begins every secret.
const Prefix = "whsec_"

// Bounds of a secret's key, in bytes: the specification asks for 24 to
// 64; shorter keys than 16 (128 bits) are refused outright.
const (
	minKey = 16
	maxKey = 64
)

// MaxSecrets bounds the secrets valid at once: the current one and the
// one it replaces.
const MaxSecrets = 2

// Secrets are a client's signing secrets, the current first.
type Secrets struct {
	keys []*standardwebhooks.Webhook
}

// Parse reads secrets, each "whsec_<base64>". The error names no secret.
func Parse(list []string) (Secrets, error) {
	if len(list) > MaxSecrets {
		return Secrets{}, fmt.Errorf("at most %d secrets may be valid at once (the current one and the one it replaces)", MaxSecrets)
	}
	var s Secrets
	for i, v := range list {
		v = strings.TrimSpace(v)
		b64, ok := strings.CutPrefix(v, Prefix)
		if !ok {
			return Secrets{}, fmt.Errorf("secret %d must start with %q", i+1, Prefix)
		}
		key, err := base64.StdEncoding.DecodeString(b64)
		if err != nil {
			return Secrets{}, fmt.Errorf("secret %d is not %s followed by base64", i+1, Prefix)
		}
		if len(key) < minKey || len(key) > maxKey {
			return Secrets{}, fmt.Errorf("secret %d holds %d bytes; it must hold %d to %d (24 or more recommended)", i+1, len(key), minKey, maxKey)
		}
		wh, err := standardwebhooks.NewWebhookRaw(key)
		if err != nil {
			return Secrets{}, fmt.Errorf("secret %d: %w", i+1, err)
		}
		s.keys = append(s.keys, wh)
	}
	return s, nil
}

// Len is the number of secrets.
func (s Secrets) Len() int { return len(s.keys) }

// Sign returns the webhook-signature header of a webhook: a signature
// with each secret.
func (s Secrets) Sign(id string, ts time.Time, body []byte) (string, error) {
	sigs := make([]string, 0, len(s.keys))
	for _, k := range s.keys {
		sig, err := k.Sign(id, ts, body)
		if err != nil {
			return "", err
		}
		sigs = append(sigs, sig)
	}
	return strings.Join(sigs, " "), nil
}

// Timestamp is the webhook-timestamp header of an attempt made at ts:
// unix seconds.
func Timestamp(ts time.Time) string { return strconv.FormatInt(ts.Unix(), 10) }
