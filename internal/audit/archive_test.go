package audit

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io/fs"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/runbox-dev/runbox/internal/s3store"
	"github.com/runbox-dev/runbox/internal/store"
	"github.com/runbox-dev/runbox/internal/store/auditlog"
	"github.com/runbox-dev/runbox/internal/testenv"
)

// archives are the file stores the log's segments may go to.
var archives = map[string]func(t *testing.T) Archive{
	"host folder": func(t *testing.T) Archive {
		a, err := NewDirArchive(t.TempDir() + "/.audit")
		if err != nil {
			t.Fatal(err)
		}
		return a
	},
	"s3": func(t *testing.T) Archive {
		s, err := s3store.Open(context.Background(), testenv.S3(t, "audit-archive"), 1<<30)
		if err != nil {
			t.Fatal(err)
		}
		return s.AuditArchive()
	},
}

// walkVerify checks the kept log where it is, as `api audit verify` does.
func walkVerify(ctx context.Context, st *auditlog.Log, a Archive, chain *Chain) (int, error) {
	var v *Verifier
	err := Walk(ctx, st, a, func(cp *Checkpoint) error {
		var err error
		v, err = chain.NewVerifier(cp)
		return err
	}, func(_ []byte, e Entry) error { return v.Next(e) })
	if err != nil {
		return 0, err
	}
	return v.Count(), nil
}

// record writes n calls (2n entries) at clock's time and seals them. The
// sealer holds the lease for an hour after it: SealAll renews it for
// leaseTTL only, which a loaded machine spends before the test's next
// export.
func record(t *testing.T, st *auditlog.Log, s *Sealer, clock clockwork.Clock, n int) {
	t.Helper()
	ctx := context.Background()
	rec := NewRecorder(st, clock, slog.New(slog.DiscardHandler))
	for i := range n {
		c, err := rec.Begin(ctx, Entry{Client: "alice", Tool: "run_code", Params: map[string]any{"i": float64(i)}})
		if err != nil {
			t.Fatal(err)
		}
		c.End(ctx, "", "run_x")
	}
	if err := s.SealAll(ctx, 30*time.Second); err != nil {
		t.Fatal(err)
	}
	if held, err := st.Lease(ctx, s.holder, time.Hour); !held {
		t.Fatalf("the lease after sealing: %v", err)
	}
}

// TestArchiveKeepsTheChain: past its bound, the oldest entries leave
// Redis for the file store, in segments, and the log still verifies
// across them — also while segments are made during the read; a segment
// changed, cut short or missing breaks the chain, named; retention drops
// whole segments behind a checkpoint.
func TestArchiveKeepsTheChain(t *testing.T) {
	for name, newArchive := range archives {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			st := auditlog.New(store.NewConn(testenv.Client(t, testenv.Redis(t))))
			chain := NewChain([]byte("audit-key-0123456789"))
			clock := clockwork.NewFakeClockAt(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC))
			a := newArchive(t)
			s := NewSealer(st, chain, 24*time.Hour, clock, slog.New(slog.DiscardHandler))
			s.Archive(a, 400)
			if held, _ := st.Lease(ctx, s.holder, time.Hour); !held {
				t.Fatal("no lease")
			}
			for range 3 {
				record(t, st, s, clock, 500)
				if err := s.Export(ctx); err != nil {
					t.Fatal(err)
				}
				clock.Advance(time.Hour)
			}
			if n, _ := st.Len(ctx); n > 400 {
				t.Fatalf("Redis holds %d entries; the bound is 400", n)
			}
			_, segs, _ := st.Archived(ctx)
			if len(segs) < 3 {
				t.Fatalf("%d segments", len(segs))
			}
			if n, err := walkVerify(ctx, st, a, chain); err != nil || n != 3000 {
				t.Fatalf("verify: %d entries, %v", n, err)
			}

			// Segments made while the log is read are followed.
			record(t, st, s, clock, 500)
			exported := false
			var v *Verifier
			err := Walk(ctx, st, a, func(cp *Checkpoint) error { v, _ = chain.NewVerifier(cp); return nil }, func(_ []byte, e Entry) error {
				if !exported && e.Seq > 2500 {
					exported = true
					s.Archive(a, 100)
					if err := s.Export(ctx); err != nil {
						return err
					}
				}
				return v.Next(e)
			})
			if err != nil || v.Count() != 4000 {
				t.Fatalf("a read during an export: %d entries, %v", v.Count(), err)
			}

			// Tampering with the file store is found and named.
			var seg Segment
			mustJSON(t, segs[1], &seg)
			orig, err := a.Get(ctx, seg.Name)
			if err != nil {
				t.Fatal(err)
			}
			lines := bytes.Split(orig, []byte("\n"))
			for _, tt := range []struct {
				name, want string
				data       []byte
			}{
				{"changed", "changed", bytes.Replace(orig, []byte(`"client":"alice"`), []byte(`"client":"bob"`), 1)},
				{"an entry removed", "removed or inserted", bytes.Join(append(append([][]byte{}, lines[:5]...), lines[6:]...), []byte("\n"))},
				{"cut short", "ends at entry", bytes.Join(lines[:len(lines)-3], []byte("\n"))},
				{"missing", "missing from the file store", nil},
			} {
				if tt.data == nil {
					a.Remove(ctx, seg.Name)
				} else {
					a.Put(ctx, seg.Name, tt.data)
				}
				_, err := walkVerify(ctx, st, a, chain)
				if err == nil || !strings.Contains(err.Error(), tt.want) || !strings.Contains(err.Error(), seg.Name) {
					t.Errorf("%s: verify = %v, want %q naming %s", tt.name, err, tt.want, seg.Name)
				}
				if tt.name == "missing" && !errors.As(err, new(*BrokenError)) {
					t.Errorf("a missing segment is not a broken chain: %T", err)
				}
			}
			a.Put(ctx, seg.Name, orig)

			// Retention drops the segments whose entries are all past it.
			clock.Advance(22 * time.Hour) // the first batch is 25 h old, the second 24 h
			_, before, _ := st.Archived(ctx)
			// Sealing renewed the lease for leaseTTL only, which a loaded
			// machine may have spent since: the sealer's loop renews it
			// at the start of each round, as this does.
			if held, _ := st.Lease(ctx, s.holder, time.Hour); !held {
				t.Fatal("no lease")
			}
			if err := s.Trim(ctx); err != nil {
				t.Fatal(err)
			}
			_, after, _ := st.Archived(ctx)
			if len(after) != len(before)-1 {
				t.Errorf("retention left %d of %d segments, want all but the first", len(after), len(before))
			}
			var first Segment
			mustJSON(t, before[0], &first)
			if _, err := a.Get(ctx, first.Name); !errors.Is(err, fs.ErrNotExist) {
				t.Errorf("a segment past retention is still stored: %v", err)
			}
			if n, err := walkVerify(ctx, st, a, chain); err != nil || n == 0 || n >= 4000 {
				t.Errorf("verify after retention: %d entries, %v", n, err)
			}
		})
	}
}

func mustJSON(t *testing.T, s string, v any) {
	t.Helper()
	if err := json.Unmarshal([]byte(s), v); err != nil {
		t.Fatal(err)
	}
}

// TestArchiveOnEmbeddedRedis: the embedded Redis (miniredis) runs the
// same scripts.
func TestArchiveOnEmbeddedRedis(t *testing.T) {
	ctx := context.Background()
	_, url := testenv.Miniredis(t)
	st := auditlog.New(store.NewConn(testenv.Client(t, url)))
	chain := NewChain([]byte("audit-key-0123456789"))
	clock := clockwork.NewRealClock()
	a := archives["host folder"](t)
	s := NewSealer(st, chain, 0, clock, slog.New(slog.DiscardHandler))
	s.Archive(a, 10)
	if held, _ := st.Lease(ctx, s.holder, time.Hour); !held {
		t.Fatal("no lease")
	}
	record(t, st, s, clock, 50)
	if err := s.Export(ctx); err != nil {
		t.Fatal(err)
	}
	if n, err := walkVerify(ctx, st, a, chain); err != nil || n != 100 {
		t.Fatalf("verify: %d entries, %v", n, err)
	}
}
