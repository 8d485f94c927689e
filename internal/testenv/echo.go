package testenv

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"io"
	"net"
	"testing"
)

// EchoBack sends n random bytes through c, which an echo server answers,
// and checks that they come back whole: both directions at once.
func EchoBack(t testing.TB, c net.Conn, n int) {
	t.Helper()
	p := make([]byte, n)
	rand.Read(p)
	want := sha256.Sum256(p)
	errc := make(chan error, 1)
	go func() {
		_, err := c.Write(p)
		errc <- err
	}()
	h := sha256.New()
	if got, err := io.CopyN(h, c, int64(n)); err != nil {
		t.Fatalf("read back %d of %d bytes: %v", got, n, err)
	}
	if err := <-errc; err != nil {
		t.Fatalf("write: %v", err)
	}
	if !bytes.Equal(h.Sum(nil), want[:]) {
		t.Fatalf("%d bytes came back changed", n)
	}
}
