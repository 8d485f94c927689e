package signature

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"fmt"
	"strings"
	"testing"
	"time"
)

// The specification's published example (its libraries' tests carry it):
// this secret, id, timestamp and body sign to this signature.
const (
	vectorSecret    = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
	vectorID        = "msg_p5jXN8AQM9LWM0D4loKWxJek"
	vectorTimestamp = 1614265330
	vectorBody      = `{"test": 2432232314}`
	vectorSignature = "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE="
)

// verify is a receiver written from the specification's text alone, not
// from the library: the signed content is id.timestamp.body, HMAC-SHA256
// keyed with the base64-decoded part of the secret after whsec_, base64
// encoded, versioned "v1,", space separated; any one matching is enough.
func verify(secret, id, timestamp string, body []byte, header string) bool {
	key, err := base64.StdEncoding.DecodeString(strings.TrimPrefix(secret, "whsec_"))
	if err != nil {
		return false
	}
	mac := hmac.New(sha256.New, key)
	mac.Write([]byte(id + "." + timestamp + "."))
	mac.Write(body)
	want := base64.StdEncoding.EncodeToString(mac.Sum(nil))
	for _, sig := range strings.Split(header, " ") {
		v, s, ok := strings.Cut(sig, ",")
		if ok && v == "v1" && hmac.Equal([]byte(s), []byte(want)) {
			return true
		}
	}
	return false
}

func TestPublishedVector(t *testing.T) {
	s, err := Parse([]string{vectorSecret})
	if err != nil {
		t.Fatal(err)
	}
	got, err := s.Sign(vectorID, time.Unix(vectorTimestamp, 0), []byte(vectorBody))
	if err != nil || got != vectorSignature {
		t.Fatalf("Sign = %q, %v; the specification's vector is %q", got, err, vectorSignature)
	}
	if !verify(vectorSecret, vectorID, fmt.Sprint(vectorTimestamp), []byte(vectorBody), got) {
		t.Fatal("the independent verifier refuses the vector")
	}
}

// TestRotation: with two secrets valid, a receiver holding either
// accepts the webhook.
func TestRotation(t *testing.T) {
	other := "whsec_" + base64.StdEncoding.EncodeToString([]byte("another-secret-of-32-bytes-long!"))
	s, err := Parse([]string{other, vectorSecret})
	if err != nil {
		t.Fatal(err)
	}
	ts := time.Unix(1700000000, 0)
	h, err := s.Sign("msg_1", ts, []byte("{}"))
	if err != nil {
		t.Fatal(err)
	}
	if n := len(strings.Split(h, " ")); n != 2 {
		t.Fatalf("%d signatures in %q", n, h)
	}
	for _, secret := range []string{other, vectorSecret} {
		if !verify(secret, "msg_1", Timestamp(ts), []byte("{}"), h) {
			t.Errorf("a receiver holding %s… refuses %q", secret[:10], h)
		}
	}
	if verify("whsec_"+base64.StdEncoding.EncodeToString([]byte("a-third-secret-nobody-has-32byte")), "msg_1", Timestamp(ts), []byte("{}"), h) {
		t.Error("a receiver holding another secret accepts it")
	}
}

func TestParseRefuses(t *testing.T) {
	short := "whsec_" + base64.StdEncoding.EncodeToString([]byte("15-bytes-secret"))
	for _, list := range [][]string{
		{"MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"}, // no prefix
		{"whsec_not base64!"},
		{short},
		{vectorSecret, vectorSecret, vectorSecret},
	} {
		if _, err := Parse(list); err == nil {
			t.Errorf("Parse(%q) accepted", list)
		} else if strings.Contains(err.Error(), "MfKQ") {
			t.Errorf("the error names the secret: %v", err)
		}
	}
}

// FuzzSign: whatever the id, time and body, the independent verifier
// accepts the signature, and refuses it for any other body.
func FuzzSign(f *testing.F) {
	f.Add(vectorID, int64(vectorTimestamp), []byte(vectorBody))
	f.Add("msg_run_0123_completed", int64(0), []byte{})
	f.Add("id.with.dots", int64(-1), []byte("\x00\xff"))
	s, err := Parse([]string{vectorSecret})
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, id string, ts int64, body []byte) {
		h, err := s.Sign(id, time.Unix(ts, 0), body)
		if err != nil {
			t.Fatal(err)
		}
		stamp := Timestamp(time.Unix(ts, 0))
		if !verify(vectorSecret, id, stamp, body, h) {
			t.Fatalf("refused: %q %q %q", id, stamp, body)
		}
		if verify(vectorSecret, id, stamp, append(body, 'x'), h) {
			t.Fatalf("accepted for another body: %q", body)
		}
	})
}
