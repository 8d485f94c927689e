package e2b

import (
	"crypto/hkdf"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"strconv"
	"strings"
	"time"

	"github.com/runbox-dev/runbox"
)

// A sandbox's tokens are derived, never stored: an HMAC, under a key of
// the deployment's secret, of the sandbox's id and a salt of its own. Its
// access token (envdAccessToken, X-Access-Token) opens its daemon and its
// code interpreter; its traffic token (trafficAccessToken,
// E2B-Traffic-Access-Token) its interpreter's contexts and, when it asks
// for private traffic, its ports' hosts. Every api replica derives the
// same; no copy of one sits in Redis to be read.

// idLen is a sandbox id's length: lower-case letters and digits, a valid
// conversation id and a DNS label (<port>-<id>.<domain>).
const idLen = 20

// newID returns a new sandbox id: 20 characters of base32, 100 bits.
func newID() string {
	return strings.ToLower(rand.Text()[:idLen])
}

// validID reports whether id could be a sandbox's: anything else is not
// looked up.
func validID(id string) bool {
	if len(id) != idLen {
		return false
	}
	for i := range len(id) {
		c := id[i]
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9') {
			return false
		}
	}
	return true
}

// newSalt returns a sandbox's salt.
func newSalt() string { return rand.Text() }

// keyOf derives the key tokens are made with from the deployment's secret.
func keyOf(secret []byte) []byte {
	k, err := hkdf.Key(sha256.New, secret, nil, "runbox e2b sandbox tokens v1", 32)
	if err != nil {
		panic("e2b: derive key: " + err.Error())
	}
	return k
}

// Kinds of token.
const (
	accessToken  = "access"
	trafficToken = "traffic"
)

// token returns a sandbox's token of a kind.
func token(key []byte, sb runbox.E2BSandbox, kind string) string {
	m := hmac.New(sha256.New, key)
	m.Write([]byte(kind + "\x00" + sb.ID + "\x00" + sb.Salt))
	return base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

// tokenIs reports, in constant time, whether got is the sandbox's token
// of kind.
func tokenIs(key []byte, sb runbox.E2BSandbox, kind, got string) bool {
	want := token(key, sb, kind)
	return got != "" && subtle.ConstantTimeCompare([]byte(got), []byte(want)) == 1
}

// signatureValid checks a signed /files URL's signature (E2B's v1): the
// SHA-256 of path, operation, user and the access token, with its
// expiry when it has one, which must not have passed.
func signatureValid(key []byte, sb runbox.E2BSandbox, path, operation, user, signature, expiration string, now time.Time) (bool, string) {
	raw := path + ":" + operation + ":" + user + ":" + token(key, sb, accessToken)
	if expiration != "" {
		exp, err := strconv.ParseInt(expiration, 10, 64)
		if err != nil {
			return false, "invalid signature expiration"
		}
		if now.Unix() > exp {
			return false, "signature is already expired"
		}
		raw += ":" + expiration
	}
	sum := sha256.Sum256([]byte(raw))
	want := "v1_" + base64.RawStdEncoding.EncodeToString(sum[:])
	if subtle.ConstantTimeCompare([]byte(signature), []byte(want)) != 1 {
		return false, "invalid signature"
	}
	return true, ""
}
