package clients

import "testing"

// TestInFlight: a client has at most its tier's concurrent_requests (or
// the default) in flight; a place given back, once, is free again; each
// client counts apart.
func TestInFlight(t *testing.T) {
	f := NewInFlight(2)
	one := Tier{ConcurrentRequests: 1}
	r1, ok := f.Acquire("a", one)
	if !ok {
		t.Fatal("the first request")
	}
	if _, ok := f.Acquire("a", one); ok {
		t.Error("past concurrent_requests")
	}
	if _, ok := f.Acquire("b", Tier{}); !ok {
		t.Error("another client")
	}
	if _, ok := f.Acquire("b", Tier{}); !ok {
		t.Error("the default's second")
	}
	if _, ok := f.Acquire("b", Tier{}); ok {
		t.Error("past the default")
	}
	r1()
	r1()
	if _, ok := f.Acquire("a", one); !ok {
		t.Error("after a release")
	}
	if _, ok := f.Acquire("a", one); ok {
		t.Error("a release given twice freed two places")
	}
}
