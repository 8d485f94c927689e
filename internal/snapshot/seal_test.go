package snapshot

import (
	"bytes"
	"crypto/rand"
	"errors"
	"io"
	"testing"
)

func seal(t *testing.T, plain []byte, secret []byte, conv string, gen uint64) []byte {
	t.Helper()
	var out bytes.Buffer
	w, err := Seal(&out, secret, conv, gen)
	if err != nil {
		t.Fatal(err)
	}
	// In odd pieces, as a snapshot arrives.
	for p := plain; len(p) > 0; {
		n := min(len(p), 77777)
		if _, err := w.Write(p[:n]); err != nil {
			t.Fatal(err)
		}
		p = p[n:]
	}
	if err := w.Close(); err != nil {
		t.Fatal(err)
	}
	return out.Bytes()
}

func open(sealed []byte, secret []byte, conv string, gen uint64) ([]byte, error) {
	r, err := Open(bytes.NewReader(sealed), secret, conv, gen)
	if err != nil {
		return nil, err
	}
	return io.ReadAll(r)
}

// TestSealRoundTrip: what is sealed opens as it was, whatever its size
// against the chunks', and the sealed bytes never hold the plaintext.
func TestSealRoundTrip(t *testing.T) {
	secret := []byte("deployment secret")
	for _, size := range []int{0, 1, chunkSize - 1, chunkSize, chunkSize + 1, 3*chunkSize + 5} {
		plain := make([]byte, size)
		rand.Read(plain)
		sealed := seal(t, plain, secret, "~acme~c1", 7)
		got, err := open(sealed, secret, "~acme~c1", 7)
		if err != nil || !bytes.Equal(got, plain) {
			t.Errorf("size %d: opened %d bytes, %v", size, len(got), err)
		}
		if size > 64 && bytes.Contains(sealed, plain[:64]) {
			t.Errorf("size %d: the plaintext is in the sealed bytes", size)
		}
	}
}

// TestSealRefuses: a snapshot opens only for its conversation, its
// generation and the secret it was sealed with, and only whole and
// unchanged.
func TestSealRefuses(t *testing.T) {
	secret := []byte("deployment secret")
	plain := bytes.Repeat([]byte("state "), chunkSize/3) // two chunks
	sealed := seal(t, plain, secret, "~acme~c1", 7)
	flipped := bytes.Clone(sealed)
	flipped[len(flipped)/2] ^= 1
	salted := bytes.Clone(sealed)
	salted[len(magic)] ^= 1
	// Cut where the first chunk ends: what is left is whole chunks.
	atChunk := sealed[:headerSize+chunkSize+tagSize]
	// The second chunk of one snapshot after the first of another.
	other := seal(t, plain, secret, "~acme~c1", 7)
	spliced := append(bytes.Clone(sealed[:headerSize+chunkSize+tagSize]), other[headerSize+chunkSize+tagSize:]...)
	cases := []struct {
		name   string
		sealed []byte
		secret string
		conv   string
		gen    uint64
	}{
		{"other conversation", sealed, string(secret), "~acme~c2", 7},
		{"other client", sealed, string(secret), "~other~c1", 7},
		{"other generation", sealed, string(secret), "~acme~c1", 8},
		{"other secret", sealed, "another secret", "~acme~c1", 7},
		{"flipped bit", flipped, string(secret), "~acme~c1", 7},
		{"changed salt", salted, string(secret), "~acme~c1", 7},
		{"cut at a chunk", atChunk, string(secret), "~acme~c1", 7},
		{"cut mid chunk", sealed[:len(sealed)-10], string(secret), "~acme~c1", 7},
		{"header only", sealed[:headerSize], string(secret), "~acme~c1", 7},
		{"spliced", spliced, string(secret), "~acme~c1", 7},
		{"not a snapshot", []byte("hello"), string(secret), "~acme~c1", 7},
	}
	for _, c := range cases {
		if _, err := open(c.sealed, []byte(c.secret), c.conv, c.gen); !errors.Is(err, ErrCorrupt) {
			t.Errorf("%s: %v, want ErrCorrupt", c.name, err)
		}
	}
	if _, err := Seal(io.Discard, nil, "c", 1); err == nil {
		t.Error("sealed without a secret")
	}
}

// BenchmarkSealOpen: sealing and opening a snapshot, per byte (100 MB
// DataFrames are the target: go test -bench Seal -benchtime 3x).
func BenchmarkSealOpen(b *testing.B) {
	plain := make([]byte, 100<<20)
	secret := []byte("secret")
	var sealed bytes.Buffer
	sealed.Grow(len(plain) + (len(plain)/chunkSize+1)*tagSize + headerSize)
	b.Run("seal", func(b *testing.B) {
		b.SetBytes(int64(len(plain)))
		for b.Loop() {
			sealed.Reset()
			w, err := Seal(&sealed, secret, "~a~c", 1)
			if err != nil {
				b.Fatal(err)
			}
			if _, err := io.Copy(w, bytes.NewReader(plain)); err != nil {
				b.Fatal(err)
			}
			if err := w.Close(); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("open", func(b *testing.B) {
		b.SetBytes(int64(len(plain)))
		for b.Loop() {
			r, err := Open(bytes.NewReader(sealed.Bytes()), secret, "~a~c", 1)
			if err != nil {
				b.Fatal(err)
			}
			if _, err := io.Copy(io.Discard, r); err != nil {
				b.Fatal(err)
			}
		}
	})
}
