// Package snapshot keeps a conversation's kept interpreter across its
// sandboxes: the snapshot its agent writes (agent.Conn.SaveState) is
// sealed here, stored in the conversation's storage under a name no
// sandbox mounts, and given back, opened, only to the same conversation's
// next sandbox, and only while no newer interpreter has started since it
// was taken.
//
// A snapshot is sealed with AES-256-GCM in chunks (the STREAM
// construction): a key of its own, derived with HKDF-SHA256 from the
// deployment's secret (FILE_SECRET), a random salt and the conversation's
// key (which names its client); every chunk's nonce counts the chunks and
// marks the last, and every chunk's additional data is the header, which
// holds the conversation's key and the snapshot's generation. So a
// snapshot cut short, reordered, moved to another conversation (or
// client), or an older one put in a newer one's place, fails to open.
// The sandbox never sees the key: sealing happens in the executor.
package snapshot

import (
	"bufio"
	"crypto/aes"
	"crypto/cipher"
	"crypto/hkdf"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
)

const (
	magic    = "RBXSNAP1"
	saltSize = 32
	// headerSize is the magic, the salt and the generation.
	headerSize = len(magic) + saltSize + 8
	// chunkSize is the plaintext of every chunk but the last.
	chunkSize = 1 << 20
	tagSize   = 16
)

// ErrCorrupt reports a snapshot that does not open: changed, cut short, of
// another conversation, or of another generation than expected.
var ErrCorrupt = errors.New("snapshot: it does not open (changed, cut short, or not this conversation's)")

// header is a sealed snapshot's first bytes, and every chunk's
// additional data with the conversation's key.
type header struct {
	salt [saltSize]byte
	gen  uint64
}

func (h header) bytes() []byte {
	b := make([]byte, 0, headerSize)
	b = append(b, magic...)
	b = append(b, h.salt[:]...)
	return binary.BigEndian.AppendUint64(b, h.gen)
}

// aead derives the snapshot's key and returns its cipher and the chunks'
// additional data.
func aead(secret []byte, conv string, h header) (cipher.AEAD, []byte, error) {
	if len(secret) == 0 {
		return nil, nil, errors.New("snapshot: no secret to seal with")
	}
	key, err := hkdf.Key(sha256.New, secret, h.salt[:], "runbox kept state v1\x00"+conv, 32)
	if err != nil {
		return nil, nil, err
	}
	block, err := aes.NewCipher(key)
	if err != nil {
		return nil, nil, err
	}
	gcm, err := cipher.NewGCM(block)
	if err != nil {
		return nil, nil, err
	}
	ad := append(h.bytes(), conv...)
	return gcm, ad, nil
}

// nonce is chunk i's: its number, and whether it is the last.
func nonce(i uint64, last bool) []byte {
	n := make([]byte, 12)
	binary.BigEndian.PutUint64(n, i)
	if last {
		n[11] = 1
	}
	return n
}

// sealer seals what is written to it onto w; Close seals the last chunk.
type sealer struct {
	w    io.Writer
	gcm  cipher.AEAD
	ad   []byte
	buf  []byte // plaintext not sealed yet
	out  []byte
	i    uint64
	n    int64 // bytes written to w
	done bool
}

// Seal returns a writer that seals what it is given, as the conversation
// conv's snapshot of generation gen, onto w. Its Close seals the end: a
// snapshot not closed does not open.
func Seal(w io.Writer, secret []byte, conv string, gen uint64) (io.WriteCloser, error) {
	h := header{gen: gen}
	if _, err := rand.Read(h.salt[:]); err != nil {
		return nil, err
	}
	gcm, ad, err := aead(secret, conv, h)
	if err != nil {
		return nil, err
	}
	s := &sealer{w: w, gcm: gcm, ad: ad, buf: make([]byte, 0, chunkSize), out: make([]byte, 0, chunkSize+tagSize)}
	if err := s.write(h.bytes()); err != nil {
		return nil, err
	}
	return s, nil
}

func (s *sealer) write(b []byte) error {
	n, err := s.w.Write(b)
	s.n += int64(n)
	return err
}

func (s *sealer) Write(p []byte) (int, error) {
	if s.done {
		return 0, errors.New("snapshot: write after close")
	}
	written := 0
	for len(p) > 0 {
		if len(s.buf) == chunkSize {
			// Full, and more follows: not the last chunk.
			if err := s.flush(false); err != nil {
				return written, err
			}
		}
		n := copy(s.buf[len(s.buf):chunkSize], p)
		s.buf = s.buf[:len(s.buf)+n]
		p = p[n:]
		written += n
	}
	return written, nil
}

func (s *sealer) flush(last bool) error {
	s.out = s.gcm.Seal(s.out[:0], nonce(s.i, last), s.buf, s.ad)
	s.i++
	s.buf = s.buf[:0]
	return s.write(s.out)
}

func (s *sealer) Close() error {
	if s.done {
		return nil
	}
	s.done = true
	return s.flush(true)
}

// opener opens a sealed snapshot as it is read.
type opener struct {
	r     *bufio.Reader
	gcm   cipher.AEAD
	ad    []byte
	in    []byte
	plain []byte // opened, not read yet
	i     uint64
	end   bool
}

// Open returns a reader of the snapshot r holds, which must be the
// conversation conv's of generation gen: anything else reads as
// ErrCorrupt, at the latest where the snapshot ends.
func Open(r io.Reader, secret []byte, conv string, gen uint64) (io.Reader, error) {
	br := bufio.NewReaderSize(r, chunkSize+tagSize+1)
	raw := make([]byte, headerSize)
	if _, err := io.ReadFull(br, raw); err != nil || string(raw[:len(magic)]) != magic {
		return nil, ErrCorrupt
	}
	var h header
	copy(h.salt[:], raw[len(magic):])
	h.gen = binary.BigEndian.Uint64(raw[len(magic)+saltSize:])
	if h.gen != gen {
		return nil, fmt.Errorf("%w: generation %d, want %d", ErrCorrupt, h.gen, gen)
	}
	gcm, ad, err := aead(secret, conv, h)
	if err != nil {
		return nil, err
	}
	return &opener{r: br, gcm: gcm, ad: ad, in: make([]byte, chunkSize+tagSize)}, nil
}

func (o *opener) Read(p []byte) (int, error) {
	for len(o.plain) == 0 {
		if o.end {
			return 0, io.EOF
		}
		if err := o.next(); err != nil {
			return 0, err
		}
	}
	n := copy(p, o.plain)
	o.plain = o.plain[n:]
	return n, nil
}

// next opens the next chunk: the last one is the one the snapshot ends
// with, shorter than a whole one or not.
func (o *opener) next() error {
	n, err := io.ReadFull(o.r, o.in)
	switch {
	case errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF):
		o.end = true
	case err != nil:
		return err
	default:
		if _, perr := o.r.Peek(1); errors.Is(perr, io.EOF) {
			o.end = true
		} else if perr != nil {
			return perr
		}
	}
	plain, err := o.gcm.Open(o.in[:0], nonce(o.i, o.end), o.in[:n], o.ad)
	if err != nil {
		return ErrCorrupt
	}
	o.i++
	o.plain = plain
	return nil
}
