// Package audit records who did what: every tool call and REST request,
// once before it executes and once with its outcome, in a log whose
// entries form a chain. Each entry carries
//
//	hash = HMAC-SHA256(AUDIT_KEY, prev_hash || JCS(entry without hash))
//
// (JCS: RFC 8785 canonical JSON), so that an entry changed, removed or
// inserted without the key breaks the chain at that point.
//
// Api replicas append raw entries (one Redis command, before the call
// runs); one sealer at a time, elected by a lease, numbers them in the
// order Redis received them and chains them into the log. Entries past
// AUDIT_RETENTION leave the log's head, and a checkpoint, itself signed,
// keeps the hash the remaining chain starts from.
package audit

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"time"

	"github.com/gowebpki/jcs"
)

// Phases of a call.
const (
	PhaseStart = "start" // recorded before the call executes
	PhaseEnd   = "end"   // recorded with its outcome
)

// Results of a call.
const (
	ResultSuccess     = "success"
	ResultFailure     = "failure"
	ResultRateLimited = "rate_limited"
	ResultDenied      = "denied"
)

// Entry is one record of the log.
type Entry struct {
	Seq          int64          `json:"seq"`
	Time         time.Time      `json:"time"`
	Call         string         `json:"call"` // pairs a call's start and end
	Phase        string         `json:"phase"`
	Client       string         `json:"client,omitempty"`
	Tool         string         `json:"tool,omitempty"`  // an MCP tool
	Route        string         `json:"route,omitempty"` // or a REST route: "POST /v1/runs"
	Conversation string         `json:"conversation,omitempty"`
	RunID        string         `json:"run_id,omitempty"`
	Params       map[string]any `json:"params,omitempty"`
	Result       string         `json:"result,omitempty"`
	Error        string         `json:"error,omitempty"`
	DurationMS   *int64         `json:"duration_ms,omitempty"`
	PrevHash     string         `json:"prev_hash,omitempty"`
	Hash         string         `json:"hash,omitempty"`
}

// Checkpoint is where the kept log starts once older entries are gone:
// the seq and hash of the last entry removed, signed.
type Checkpoint struct {
	Seq  int64     `json:"seq"`
	Hash string    `json:"hash"`
	Time time.Time `json:"time"`
	Sig  string    `json:"sig"`
}

// ResultOf maps an error code (runbox.E*) to a result.
func ResultOf(code string) string {
	switch code {
	case "":
		return ResultSuccess
	case "rate_limited", "quota_exceeded", "RATE_LIMIT_EXCEEDED", "QUOTA_EXCEEDED":
		return ResultRateLimited
	case "unauthorized":
		return ResultDenied
	}
	return ResultFailure
}

// Chain signs entries with a key.
type Chain struct {
	key []byte
}

// NewChain returns a Chain with key.
func NewChain(key []byte) *Chain { return &Chain{key: key} }

// Seal numbers e after prev (seq, hash) and signs it.
func (c *Chain) Seal(e *Entry, prevSeq int64, prevHash string) error {
	e.Seq, e.PrevHash, e.Hash = prevSeq+1, prevHash, ""
	h, err := c.hash(e)
	if err != nil {
		return err
	}
	e.Hash = h
	return nil
}

func (c *Chain) hash(e *Entry) (string, error) {
	body := *e
	body.Hash = ""
	b, err := json.Marshal(body)
	if err != nil {
		return "", err
	}
	canon, err := jcs.Transform(b)
	if err != nil {
		return "", fmt.Errorf("canonical form: %w", err)
	}
	m := hmac.New(sha256.New, c.key)
	m.Write([]byte(e.PrevHash))
	m.Write(canon)
	return hex.EncodeToString(m.Sum(nil)), nil
}

// SignCheckpoint signs cp.
func (c *Chain) SignCheckpoint(cp *Checkpoint) {
	cp.Sig = c.checkpointSig(*cp)
}

func (c *Chain) checkpointSig(cp Checkpoint) string {
	m := hmac.New(sha256.New, c.key)
	fmt.Fprintf(m, "checkpoint\n%d\n%s\n%d", cp.Seq, cp.Hash, cp.Time.UnixNano())
	return hex.EncodeToString(m.Sum(nil))
}

// Verifier checks a log, entry by entry, from its checkpoint (nil: from
// the first entry ever).
type Verifier struct {
	chain    *Chain
	prevSeq  int64
	prevHash string
	n        int
}

// NewVerifier starts a verification at cp.
func (c *Chain) NewVerifier(cp *Checkpoint) (*Verifier, error) {
	v := &Verifier{chain: c}
	if cp != nil {
		if !hmac.Equal([]byte(cp.Sig), []byte(c.checkpointSig(*cp))) {
			return nil, fmt.Errorf("the checkpoint (seq %d) is not signed by this key", cp.Seq)
		}
		v.prevSeq, v.prevHash = cp.Seq, cp.Hash
	}
	return v, nil
}

// Next checks the next entry; the error names it.
func (v *Verifier) Next(e Entry) error {
	v.n++
	if e.Seq != v.prevSeq+1 {
		return fmt.Errorf("entry %d (seq %d): expected seq %d: an entry was removed or inserted", v.n, e.Seq, v.prevSeq+1)
	}
	if e.PrevHash != v.prevHash {
		return fmt.Errorf("entry %d (seq %d): its prev_hash is not the hash of the entry before it", v.n, e.Seq)
	}
	want, err := v.chain.hash(&e)
	if err != nil {
		return fmt.Errorf("entry %d (seq %d): %w", v.n, e.Seq, err)
	}
	if !hmac.Equal([]byte(want), []byte(e.Hash)) {
		return fmt.Errorf("entry %d (seq %d): its hash does not match its content: it was changed", v.n, e.Seq)
	}
	v.prevSeq, v.prevHash = e.Seq, e.Hash
	return nil
}

// Count returns how many entries were checked.
func (v *Verifier) Count() int { return v.n }
