package link

import (
	"crypto/hkdf"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// Every request to an executor carries, in authHeader, the time it was
// made and HMAC-SHA256 of that time, its method, its URI and the SHA-256
// of its body, under a key derived from the secret every process of the
// deployment shares (FILE_SECRET, or the one kept in Redis). A request
// older or newer than maxSkew is refused, so a recorded one cannot be
// replayed later; the key itself never crosses the network.
const (
	authHeader = "X-Runbox-Link"
	maxSkew    = time.Minute
)

// Key derives the link's key from the deployment's shared secret.
func Key(secret []byte) []byte {
	k, err := hkdf.Key(sha256.New, secret, nil, "runbox executor link v1", 32)
	if err != nil {
		panic("link: derive key: " + err.Error()) // only for lengths over 255*32
	}
	return k
}

func mac(key []byte, ts, method, uri string, body []byte) []byte {
	sum := sha256.Sum256(body)
	h := hmac.New(sha256.New, key)
	h.Write([]byte(ts + "\n" + method + "\n" + uri + "\n" + hex.EncodeToString(sum[:])))
	return h.Sum(nil)
}

// sign sets the authentication header of r, whose body is body.
func sign(key []byte, now time.Time, r *http.Request, body []byte) {
	ts := strconv.FormatInt(now.Unix(), 10)
	r.Header.Set(authHeader, ts+"."+hex.EncodeToString(mac(key, ts, r.Method, r.URL.RequestURI(), body)))
}

// verify checks the authentication header of r, whose body is body.
func verify(key []byte, now time.Time, r *http.Request, body []byte) bool {
	ts, sig, ok := strings.Cut(r.Header.Get(authHeader), ".")
	if !ok {
		return false
	}
	sec, err := strconv.ParseInt(ts, 10, 64)
	if err != nil {
		return false
	}
	if d := now.Sub(time.Unix(sec, 0)); d > maxSkew || d < -maxSkew {
		return false
	}
	got, err := hex.DecodeString(sig)
	if err != nil {
		return false
	}
	return hmac.Equal(got, mac(key, ts, r.Method, r.URL.RequestURI(), body))
}
