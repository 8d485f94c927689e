// Package preview makes the servers that runs start reachable from a
// browser, through capability URLs on host names of their own: it issues
// the capabilities (get_preview_url), resolves them, and proxies a preview
// host's requests to the sandbox that holds the server, on whichever
// executor that is.
package preview

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base32"
	"encoding/binary"
	"errors"
	"strings"
	"time"
)

// A capability is one DNS label: the lower-case base32 (RFC 4648, no
// padding) of 32 bytes:
//
//	version (1) | expiry, Unix seconds (4) | port (2) | record id (10) | head tag (8) | tag (7)
//
// The record id names the preview's record in Redis (store.Preview): the
// client, the conversation and the sandboxes the URL was issued for. The
// head tag is HMAC-SHA256 of the first 17 bytes, and the tag HMAC-SHA256
// of them with the client and the conversation, each truncated, under
// keys only the service holds. Nobody can make a capability, nor turn one
// into another (another port, a later expiry, another record): the head
// tag says so before anything is looked up, so a made-up label costs the
// service no Redis read; the tag then binds the record's client and
// conversation to it.
const (
	capVersion = 1
	idLen      = 10
	headLen    = 1 + 4 + 2 + idLen
	headTagLen = 8
	tagLen     = 7
	capLen     = headLen + headTagLen + tagLen
	// LabelLen is the length of a capability as text: 52 characters, within
	// the 63 of a DNS label.
	LabelLen = (capLen*8 + 4) / 5
)

var encoding = base32.NewEncoding("abcdefghijklmnopqrstuvwxyz234567").WithPadding(base32.NoPadding)

// ErrInvalid reports a label that is not a capability this service made,
// or one whose time is over. The two are not told apart.
var ErrInvalid = errors.New("preview: invalid or expired capability")

// Capability is what a preview URL's first label says.
type Capability struct {
	Expires time.Time
	Port    int
	ID      [idLen]byte
	tag     [tagLen]byte
}

// Signer makes and checks capabilities with one key.
type Signer struct {
	head, conv []byte // keys of the two tags
}

// NewSigner returns a Signer with key (at least 32 bytes of secret).
func NewSigner(key []byte) *Signer {
	sub := func(label string) []byte {
		h := hmac.New(sha256.New, key)
		h.Write([]byte(label))
		return h.Sum(nil)
	}
	return &Signer{head: sub("head"), conv: sub("conversation")}
}

func (c Capability) header() []byte {
	b := make([]byte, 0, capLen)
	b = append(b, capVersion)
	b = binary.BigEndian.AppendUint32(b, uint32(c.Expires.Unix()))
	b = binary.BigEndian.AppendUint16(b, uint16(c.Port))
	return append(b, c.ID[:]...)
}

func (s *Signer) headTag(head []byte) []byte {
	h := hmac.New(sha256.New, s.head)
	h.Write(head)
	return h.Sum(nil)[:headTagLen]
}

func (s *Signer) tag(head []byte, client, conversation string) []byte {
	h := hmac.New(sha256.New, s.conv)
	h.Write(head)
	// Names never hold a NUL: the separators make the input unambiguous.
	h.Write([]byte{0})
	h.Write([]byte(client))
	h.Write([]byte{0})
	h.Write([]byte(conversation))
	return h.Sum(nil)[:tagLen]
}

// Sign returns the label of a capability for port of a client's
// conversation (its key) until expires, naming record id.
func (s *Signer) Sign(id [idLen]byte, port int, expires time.Time, client, conversation string) string {
	head := Capability{Expires: expires, Port: port, ID: id}.header()
	b := append(append(head, s.headTag(head)...), s.tag(head, client, conversation)...)
	return encoding.EncodeToString(b)
}

// Parse reads a label and checks its head tag; the tag needs the record it
// names (Verify). It refuses whatever is not exactly a label Sign made,
// and capabilities expired at now.
func (s *Signer) Parse(label string, now time.Time) (Capability, error) {
	var c Capability
	if len(label) != LabelLen {
		return c, ErrInvalid
	}
	label = strings.ToLower(label) // host names are not case-sensitive
	b, err := encoding.DecodeString(label)
	// Base32 leaves 4 bits unused at the end: only the encoding Sign makes
	// (those bits zero) is accepted, so that one capability has one label.
	if err != nil || len(b) != capLen || b[0] != capVersion || encoding.EncodeToString(b) != label {
		return c, ErrInvalid
	}
	if !hmac.Equal(b[headLen:headLen+headTagLen], s.headTag(b[:headLen])) {
		return c, ErrInvalid
	}
	c.Expires = time.Unix(int64(binary.BigEndian.Uint32(b[1:5])), 0)
	c.Port = int(binary.BigEndian.Uint16(b[5:7]))
	copy(c.ID[:], b[7:headLen])
	copy(c.tag[:], b[headLen+headTagLen:])
	if c.Port == 0 || !now.Before(c.Expires) {
		return Capability{}, ErrInvalid
	}
	return c, nil
}

// Verify reports whether c was signed for the conversation of client. The
// comparison takes constant time.
func (s *Signer) Verify(c Capability, client, conversation string) bool {
	return hmac.Equal(c.tag[:], s.tag(c.header(), client, conversation))
}
