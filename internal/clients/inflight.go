package clients

import "sync"

// InFlight counts each client's requests in flight, within its tier's
// concurrent_requests (or a default): one count for every door a client
// comes in by (MCP and REST, the E2B API), so that none adds to another.
type InFlight struct {
	def int
	mu  sync.Mutex
	n   map[string]int
}

// NewInFlight returns an InFlight whose clients with no
// concurrent_requests may have def requests in flight.
func NewInFlight(def int) *InFlight { return &InFlight{def: def, n: map[string]int{}} }

// Acquire takes a place for a request of client (of tier t): release
// gives it back; false, and no place, when the client has its maximum in
// flight.
func (f *InFlight) Acquire(client string, t Tier) (release func(), ok bool) {
	limit := f.def
	if t.ConcurrentRequests > 0 {
		limit = t.ConcurrentRequests
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.n[client] >= limit {
		return nil, false
	}
	f.n[client]++
	var once sync.Once
	return func() {
		once.Do(func() {
			f.mu.Lock()
			defer f.mu.Unlock()
			if f.n[client]--; f.n[client] == 0 {
				delete(f.n, client)
			}
		})
	}, true
}
