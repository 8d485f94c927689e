package audit

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"

	"github.com/runbox-dev/runbox/internal/store/auditlog"
)

// BrokenError says the kept log is not whole: a segment the index names
// is missing from the archive, or is not what the index says.
type BrokenError struct{ msg string }

func (e *BrokenError) Error() string { return e.msg }

func broken(format string, args ...any) error { return &BrokenError{fmt.Sprintf(format, args...)} }

// readPage is how many entries one read of Redis takes.
const readPage = 1000

// Walk reads the kept log in order: start receives the checkpoint it
// starts from (nil: its first entry), then entry each entry, with its
// text as sealed — from the archive's segments (archive may be nil when
// there are none), then from Redis. Segments exported while it reads are
// followed. An error of entry is returned wrapped with where the entry
// is; a segment missing or cut short is a *BrokenError.
func Walk(ctx context.Context, st *auditlog.Log, archive Archive, start func(*Checkpoint) error,
	entry func(raw []byte, e Entry) error) error {
	cpRaw, segs, err := st.Archived(ctx)
	if err != nil {
		return err
	}
	next := int64(1)
	var cp *Checkpoint
	if cpRaw != "" {
		cp = new(Checkpoint)
		if err := json.Unmarshal([]byte(cpRaw), cp); err != nil {
			return fmt.Errorf("read checkpoint: %w", err)
		}
		next = cp.Seq + 1
	}
	if err := start(cp); err != nil {
		return err
	}
	// segments emits the segments of the index that hold next or later,
	// and reports whether one held next.
	segments := func(index []string) (bool, error) {
		found := false
		for _, raw := range index {
			var seg Segment
			if err := json.Unmarshal([]byte(raw), &seg); err != nil {
				return false, fmt.Errorf("read audit segment index: %w", err)
			}
			if seg.Last < next {
				continue
			}
			found = found || seg.First <= next
			after, err := walkSegment(ctx, archive, seg, next, entry)
			if err != nil {
				return false, err
			}
			next = after
		}
		return found, nil
	}
	if _, err := segments(segs); err != nil {
		return err
	}
	for {
		head, page, err := st.Page(ctx, next, readPage)
		if err != nil {
			return err
		}
		if head == 0 || head > next {
			// What is looked for left Redis since the index was read: to
			// a segment, or with retention.
			_, segs, err := st.Archived(ctx)
			if err != nil {
				return err
			}
			found, err := segments(segs)
			switch {
			case err != nil:
				return err
			case found:
				continue
			case head == 0:
				return nil
			}
			return fmt.Errorf("entries %d to %d left the log with retention while it was read; read it again", next, head-1)
		}
		for _, raw := range page {
			var e Entry
			if err := json.Unmarshal([]byte(raw), &e); err != nil {
				return fmt.Errorf("read entry %d: %w", next, err)
			}
			if err := entry([]byte(raw), e); err != nil {
				return err
			}
			next = e.Seq + 1
		}
		if len(page) < readPage {
			return nil
		}
	}
}

// walkSegment emits the entries of seg from next on and returns the
// number after its last.
func walkSegment(ctx context.Context, archive Archive, seg Segment, next int64, entry func([]byte, Entry) error) (int64, error) {
	if archive == nil {
		return next, broken("segment %s (entries %d to %d) is in the index, and there is no archive to read it from", seg.Name, seg.First, seg.Last)
	}
	data, err := archive.Get(ctx, seg.Name)
	if errors.Is(err, fs.ErrNotExist) {
		return next, broken("segment %s (entries %d to %d) is missing from the file store", seg.Name, seg.First, seg.Last)
	}
	if err != nil {
		return next, err
	}
	last := int64(0)
	for i, line := range bytes.Split(bytes.TrimRight(data, "\n"), []byte("\n")) {
		var e Entry
		if err := json.Unmarshal(line, &e); err != nil {
			return next, broken("segment %s: line %d is not an entry", seg.Name, i+1)
		}
		last = e.Seq
		if e.Seq < next {
			continue
		}
		if err := entry(line, e); err != nil {
			return next, fmt.Errorf("segment %s, line %d: %w", seg.Name, i+1, err)
		}
		next = e.Seq + 1
	}
	if last != seg.Last {
		return next, broken("segment %s ends at entry %d; the index says %d", seg.Name, last, seg.Last)
	}
	return next, nil
}
