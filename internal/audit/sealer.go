package audit

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/runbox-dev/runbox/internal/lifecycle"
	"github.com/runbox-dev/runbox/internal/store/auditlog"
)

const (
	// leaseTTL is how long a sealer holds its lease without renewing it;
	// another api takes over this long after the sealer died.
	leaseTTL = 5 * time.Second
	// leaseRenew is how often a sealer that holds the lease renews it: a
	// turn of its loop waits up to sealWait, so it is renewed well within
	// leaseTTL.
	leaseRenew = leaseTTL / 5
	// sealWait is how long the sealer waits on the raw stream for news.
	sealWait = time.Second
	// sealBatch bounds the entries sealed in one script.
	sealBatch = 500
	// trimEvery is how often entries past retention are looked for.
	trimEvery = time.Minute
	// maxSegment bounds the entries of one segment of the archive.
	maxSegment = 10000
)

// Sealer chains raw entries into the log while it holds the lease; every
// api runs one, one of them works. Start/Stop as every background part.
type Sealer struct {
	lifecycle.Base
	store     *auditlog.Log
	chain     *Chain
	retention time.Duration
	clock     clockwork.Clock
	log       *slog.Logger
	holder    string
	// archive, when set, takes the oldest entries once Redis holds more
	// than maxEntries.
	archive    Archive
	maxEntries int64
}

// NewSealer returns a Sealer; retention 0 keeps every entry.
func NewSealer(st *auditlog.Log, chain *Chain, retention time.Duration, clock clockwork.Clock, log *slog.Logger) *Sealer {
	return &Sealer{store: st, chain: chain, retention: retention, clock: clock,
		log: log.With("component", "audit"), holder: rand.Text()}
}

// Archive makes the sealer move the oldest sealed entries to a, in
// segments, whenever Redis holds more than maxEntries of them
// (AUDIT_MAX_REDIS_ENTRIES). Call it before Start.
func (s *Sealer) Archive(a Archive, maxEntries int) {
	s.archive, s.maxEntries = a, int64(maxEntries)
}

// Start runs the sealer until Stop.
func (s *Sealer) Start(ctx context.Context) error {
	return s.Base.Run(ctx, s.loop)
}

func (s *Sealer) loop(ctx context.Context) {
	defer func() { _ = s.store.Release(context.WithoutCancel(ctx), s.holder) }()
	var (
		lastTrim time.Time
		// While the lease is held no other sealer moves the chain: its
		// head is read once, not before every seal, and the lease renewed
		// every leaseRenew, not at every turn (a turn is a seal, and every
		// call of a tool records two entries). The seal script checks both
		// all the same: a sealer that lost the lease, or whose head is
		// stale, is refused (ErrConflict), and reads them again.
		leased time.Time
		head   *auditlog.Head
		// length is the log's length after the last seal; -1: unknown,
		// 0: at most the archive's bound (an export leaves it so).
		length int64 = -1
	)
	for ctx.Err() == nil {
		if leased.IsZero() || s.clock.Since(leased) >= leaseRenew {
			held, err := s.store.Lease(ctx, s.holder, leaseTTL)
			if err != nil || !held {
				if err != nil && ctx.Err() == nil {
					s.log.Warn("audit sealer lease", "err", err)
				}
				leased, head = time.Time{}, nil
				select {
				case <-ctx.Done():
				case <-s.clock.After(leaseTTL / 2):
				}
				continue
			}
			leased = s.clock.Now()
		}
		if head == nil {
			h, err := s.store.Head(ctx)
			if err != nil {
				s.pause(ctx, "read the audit chain's head", err)
				continue
			}
			head = &h
		}
		to, n, l, err := s.seal(ctx, *head, sealWait)
		switch {
		case errors.Is(err, auditlog.ErrConflict):
			leased, head = time.Time{}, nil
			continue
		case err != nil:
			head = nil
			s.pause(ctx, "seal audit entries", err)
		case n > 0:
			head, length = &to, l
		}
		if s.archive != nil && s.maxEntries > 0 && (length < 0 || length > s.maxEntries) {
			if err := s.Export(ctx); err != nil {
				if ctx.Err() == nil {
					s.log.Error("export audit entries to the file store", "err", err)
				}
			} else {
				length = 0
			}
		}
		if s.retention > 0 && s.clock.Since(lastTrim) >= trimEvery {
			lastTrim = s.clock.Now()
			if err := s.Trim(ctx); err != nil && ctx.Err() == nil {
				s.log.Warn("trim audit log", "err", err)
			}
		}
	}
}

// pause logs err, unless ctx is done, and waits a second.
func (s *Sealer) pause(ctx context.Context, what string, err error) {
	if ctx.Err() != nil {
		return
	}
	s.log.Warn(what, "err", err)
	select {
	case <-ctx.Done():
	case <-s.clock.After(time.Second):
	}
}

// SealPending seals what waits, waiting up to block for something when
// nothing does. The caller holds the lease. It returns how many it sealed.
func (s *Sealer) SealPending(ctx context.Context, block time.Duration) (int, error) {
	head, err := s.store.Head(ctx)
	if err != nil {
		return 0, err
	}
	_, n, _, err := s.seal(ctx, head, block)
	return n, err
}

// seal seals what waits after head, waiting up to block for something
// when nothing does. It returns the chain's new head, how many it sealed
// and the log's length after them.
func (s *Sealer) seal(ctx context.Context, head auditlog.Head, block time.Duration) (auditlog.Head, int, int64, error) {
	raws, err := s.store.Pending(ctx, head.LastRaw, sealBatch, block)
	if err != nil || len(raws) == 0 {
		return head, 0, 0, err
	}
	to := head
	sealed := make([]string, 0, len(raws))
	ids := make([]string, 0, len(raws))
	for _, r := range raws {
		var e Entry
		if err := json.Unmarshal([]byte(r.Entry), &e); err != nil {
			// Only replicas write the stream; keep the trace of a bad one
			// rather than drop it.
			e = Entry{Phase: "unreadable", Params: map[string]any{"raw_len": len(r.Entry)}}
		}
		if err := s.chain.Seal(&e, to.Seq, to.Hash); err != nil {
			return head, 0, 0, err
		}
		b, err := json.Marshal(e)
		if err != nil {
			return head, 0, 0, err
		}
		sealed = append(sealed, string(b))
		ids = append(ids, r.ID)
		to.Seq, to.Hash, to.LastRaw = e.Seq, e.Hash, r.ID
	}
	length, err := s.store.Seal(ctx, s.holder, head, to, sealed, ids)
	if err != nil {
		return head, 0, 0, err
	}
	return to, len(sealed), length, nil
}

// Export moves the oldest sealed entries to the archive, a segment at a
// time, while Redis holds more than its bound: each segment is stored
// whole before its entries leave Redis, so none is ever only in neither.
// The caller holds the lease.
func (s *Sealer) Export(ctx context.Context) error {
	if s.archive == nil || s.maxEntries <= 0 {
		return nil
	}
	for {
		n, err := s.store.Len(ctx)
		if err != nil || n <= s.maxEntries {
			return err
		}
		// Down to three quarters of the bound, so that segments are not
		// made one entry at a time.
		size := min(n-s.maxEntries*3/4, maxSegment)
		raw, err := s.store.Entries(ctx, 0, size-1)
		if err != nil || len(raw) == 0 {
			return err
		}
		var first, last Entry
		if err := json.Unmarshal([]byte(raw[0]), &first); err != nil {
			return fmt.Errorf("read audit entry: %w", err)
		}
		if err := json.Unmarshal([]byte(raw[len(raw)-1]), &last); err != nil {
			return fmt.Errorf("read audit entry: %w", err)
		}
		seg := Segment{Name: segmentName(first.Seq, last.Seq), First: first.Seq, Last: last.Seq, LastHash: last.Hash,
			LastTime: last.Time.UTC().Format(time.RFC3339Nano)}
		var data []byte
		for _, r := range raw {
			data = append(append(data, r...), '\n')
		}
		if err := s.archive.Put(ctx, seg.Name, data); err != nil {
			return err
		}
		index, _ := json.Marshal(seg)
		if err := s.store.Exported(ctx, s.holder, raw[0], int64(len(raw)), string(index)); err != nil {
			return err
		}
		s.log.Info("audit entries exported to the file store", "segment", seg.Name, "entries", len(raw))
	}
}

// Trim removes the entries past retention — whole segments of the
// archive first, then entries in Redis once none is left — leaving a
// signed checkpoint at the last one removed.
func (s *Sealer) Trim(ctx context.Context) error {
	cutoff := s.clock.Now().Add(-s.retention)
	for {
		_, segs, err := s.store.Archived(ctx)
		if err != nil || len(segs) == 0 {
			if err != nil {
				return err
			}
			break
		}
		var seg Segment
		if err := json.Unmarshal([]byte(segs[0]), &seg); err != nil {
			return fmt.Errorf("read audit segment index: %w", err)
		}
		if t, err := time.Parse(time.RFC3339Nano, seg.LastTime); err != nil || !t.Before(cutoff) {
			return err
		}
		cp := Checkpoint{Seq: seg.Last, Hash: seg.LastHash, Time: s.clock.Now().UTC()}
		s.chain.SignCheckpoint(&cp)
		b, _ := json.Marshal(cp)
		if err := s.store.DropSegment(ctx, s.holder, segs[0], string(b)); err != nil {
			return err
		}
		if s.archive != nil {
			if err := s.archive.Remove(ctx, seg.Name); err != nil {
				s.log.Warn("remove an audit segment past retention", "segment", seg.Name, "err", err)
			}
		}
	}
	for {
		raw, err := s.store.Entries(ctx, 0, sealBatch-1)
		if err != nil {
			return err
		}
		n := 0
		var last Entry
		for _, r := range raw {
			var e Entry
			if err := json.Unmarshal([]byte(r), &e); err != nil {
				return fmt.Errorf("read audit entry: %w", err)
			}
			if !e.Time.Before(cutoff) {
				break
			}
			n, last = n+1, e
		}
		if n == 0 {
			return nil
		}
		cp := Checkpoint{Seq: last.Seq, Hash: last.Hash, Time: s.clock.Now().UTC()}
		s.chain.SignCheckpoint(&cp)
		b, _ := json.Marshal(cp)
		if err := s.store.Trim(ctx, s.holder, int64(n), string(b)); err != nil {
			return err
		}
		if n < len(raw) {
			return nil
		}
	}
}

// SealAll seals everything recorded up to now, taking the lease if it is
// free, or waits for the sealer that holds it; for export.
func (s *Sealer) SealAll(ctx context.Context, timeout time.Duration) error {
	target, err := s.store.LastRaw(ctx)
	if err != nil {
		return err
	}
	deadline := s.clock.Now().Add(timeout)
	for {
		head, err := s.store.Head(ctx)
		if err != nil {
			return err
		}
		if !rawBefore(head.LastRaw, target) {
			return nil
		}
		if held, err := s.store.Lease(ctx, s.holder, leaseTTL); err == nil && held {
			_, err := s.SealPending(ctx, 0)
			if err != nil && !errors.Is(err, auditlog.ErrConflict) {
				return err
			}
			continue
		}
		if s.clock.Now().After(deadline) {
			return errors.New("audit: the entries recorded before the export were not sealed in time")
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-s.clock.After(50 * time.Millisecond):
		}
	}
}

// Release gives the lease up.
func (s *Sealer) Release(ctx context.Context) error { return s.store.Release(ctx, s.holder) }

// rawBefore reports whether stream id a comes before b ("ms-seq").
func rawBefore(a, b string) bool {
	var am, as, bm, bs int64
	fmt.Sscanf(a, "%d-%d", &am, &as)
	fmt.Sscanf(b, "%d-%d", &bm, &bs)
	return am < bm || (am == bm && as < bs)
}
