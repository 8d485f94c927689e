package egress

import "github.com/runbox-dev/runbox"

// Records: every connection, made or refused, is recorded, and those
// past a run's MaxRecords counted.

// countKey is what the connections counted together share.
type countKey struct {
	host    string
	port    int
	allowed bool
	reason  string
}

// add records a connection: one by one up to MaxRecords, then as a
// count of the connections with the same host, port, outcome and reason
// (past maxCounts of those, of any other), so that a program opening
// connections in a loop costs the run's events, result and the audit log
// a bounded size.
func (r *Run) add(e runbox.Egress) {
	r.p.log.Debug("egress", "run", r.id, "host", e.Host, "port", e.Port, "allowed", e.Allowed, "reason", e.Reason,
		"bytes_in", e.BytesIn, "bytes_out", e.BytesOut)
	r.mu.Lock()
	if len(r.records) < r.p.s.MaxRecords {
		r.records = append(r.records, e)
		r.mu.Unlock()
		if r.record != nil {
			r.record(e)
		}
		return
	}
	defer r.mu.Unlock()
	k := countKey{host: e.Host, port: e.Port, allowed: e.Allowed, reason: e.Reason}
	c := r.counts[k]
	if c == nil && len(r.counts) >= maxCounts {
		k = countKey{allowed: e.Allowed, reason: otherConnections}
		c = r.counts[k]
	}
	if c == nil {
		c = &runbox.Egress{Host: k.host, Port: k.port, Allowed: k.allowed, Reason: k.reason}
		r.counts[k] = c
	}
	c.Count++
	c.BytesIn += e.BytesIn
	c.BytesOut += e.BytesOut
}

// otherConnections is the reason of the count that takes the connections
// past maxCounts distinct ones.
const otherConnections = "other connections (too many distinct hosts and reasons to count apart)"
