package app

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/runbox-dev/runbox/internal/audit"
	"github.com/runbox-dev/runbox/internal/config"
	"github.com/runbox-dev/runbox/internal/files"
	"github.com/runbox-dev/runbox/internal/store/auditlog"
)

// AuditChain returns the chain of AUDIT_KEY, or of a key kept under
// SANDBOX_ROOT (made the first time), as FILE_SECRET is.
func AuditChain(cfg *config.Config) (*audit.Chain, error) {
	key := cfg.AuditKey
	if len(key) == 0 {
		var err error
		if key, err = files.LoadOrCreateSecret(filepath.Join(cfg.SandboxRoot, ".audit-key")); err != nil {
			return nil, fmt.Errorf("audit key: %w", err)
		}
	}
	return audit.NewChain(key), nil
}

// exportWait bounds how long an export waits for the entries recorded
// before it to be sealed.
const exportWait = 30 * time.Second

// RunAudit runs `api audit export|verify` and returns the exit code: 0
// done (or intact), 1 a broken chain, 2 a usage or service error.
func RunAudit(ctx context.Context, cfg *config.Config, args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 || (args[0] != "export" && args[0] != "verify") {
		fmt.Fprintln(stderr, "usage: api audit export [--since RFC3339] | api audit verify [--file F]")
		return 2
	}
	fs := flag.NewFlagSet("audit "+args[0], flag.ContinueOnError)
	fs.SetOutput(stderr)
	since := fs.String("since", "", "export entries from this time on (RFC 3339)")
	file := fs.String("file", "", "verify this export instead of the live log")
	if err := fs.Parse(args[1:]); err != nil {
		return 2
	}
	chain, err := AuditChain(cfg)
	if err != nil {
		fmt.Fprintln(stderr, "audit:", err)
		return 2
	}
	if args[0] == "verify" && *file != "" {
		f, err := os.Open(*file)
		if err != nil {
			fmt.Fprintln(stderr, "audit:", err)
			return 2
		}
		defer f.Close()
		n, err := verifyLines(chain, f)
		return report(n, err, stdout, stderr)
	}
	if cfg.RedisURL == "" {
		fmt.Fprintln(stderr, "audit: REDIS_URL is required: the audit log lives in the service's Redis")
		return 2
	}
	rds, err := OpenRedis(ctx, cfg)
	if err != nil {
		fmt.Fprintln(stderr, "audit:", err)
		return 2
	}
	defer rds.Close()
	st := auditlog.New(rds.Conn)
	archive, err := AuditArchive(ctx, cfg)
	if err != nil {
		fmt.Fprintln(stderr, "audit:", err)
		return 2
	}
	switch args[0] {
	case "export":
		var from time.Time
		if *since != "" {
			if from, err = time.Parse(time.RFC3339, *since); err != nil {
				fmt.Fprintln(stderr, "audit: --since must be an RFC 3339 time, such as 2026-01-02T15:04:05Z")
				return 2
			}
		}
		sealer := audit.NewSealer(st, chain, 0, clockwork.NewRealClock(), slog.New(slog.DiscardHandler))
		defer sealer.Release(context.WithoutCancel(ctx))
		if err := sealer.SealAll(ctx, exportWait); err != nil {
			fmt.Fprintln(stderr, "audit:", err)
			return 2
		}
		if err := export(ctx, st, archive, chain, from, stdout); err != nil {
			fmt.Fprintln(stderr, "audit:", err)
			if _, ok := errors.AsType[*audit.BrokenError](err); ok {
				return 1
			}
			return 2
		}
		return 0
	default:
		n, err := verifyLive(ctx, st, archive, chain)
		if err != nil {
			if _, ok := errors.AsType[*verifyError](err); !ok {
				if _, ok := errors.AsType[*audit.BrokenError](err); !ok {
					fmt.Fprintln(stderr, "audit:", err)
					return 2
				}
			}
		}
		return report(n, err, stdout, stderr)
	}
}

// AuditArchive returns where the audit log's oldest entries go once Redis
// holds AUDIT_MAX_REDIS_ENTRIES: the file store's — the S3 bucket of
// FILE_STORE, else SANDBOX_ROOT/.audit.
func AuditArchive(ctx context.Context, cfg *config.Config) (audit.Archive, error) {
	if cfg.FileStore != nil {
		s3, err := OpenS3(ctx, cfg)
		if err != nil {
			return nil, err
		}
		return s3.AuditArchive(), nil
	}
	return audit.NewDirArchive(filepath.Join(cfg.SandboxRoot, ".audit"))
}

// exportLine is one line of an export: a checkpoint (the first line, when
// the log does not start at its first entry) or an entry.
type exportLine struct {
	Checkpoint *audit.Checkpoint `json:"checkpoint,omitempty"`
	*audit.Entry
}

// export writes the kept log — the archive's segments, then Redis's
// entries — as JSON lines, from the first entry at or after from,
// preceded by the checkpoint it starts from.
func export(ctx context.Context, st *auditlog.Log, archive audit.Archive, chain *audit.Chain, from time.Time, w io.Writer) error {
	bw := bufio.NewWriter(w)
	var cp *audit.Checkpoint
	started := from.IsZero()
	var prev *audit.Entry
	err := audit.Walk(ctx, st, archive, func(c *audit.Checkpoint) error { cp = c; return nil }, func(raw []byte, e audit.Entry) error {
		if !started && !e.Time.Before(from) {
			started = true
			if prev != nil {
				// A partial export starts from a checkpoint at the entry
				// before it, signed now.
				cp = &audit.Checkpoint{Seq: prev.Seq, Hash: prev.Hash, Time: time.Now().UTC()}
				chain.SignCheckpoint(cp)
			}
		}
		if !started {
			prev = &e
			return nil
		}
		if cp != nil {
			if err := writeLine(bw, exportLine{Checkpoint: cp}); err != nil {
				return err
			}
			cp = nil
		}
		if _, err := bw.Write(raw); err != nil {
			return err
		}
		return bw.WriteByte('\n')
	})
	if err != nil {
		return err
	}
	if cp != nil {
		if err := writeLine(bw, exportLine{Checkpoint: cp}); err != nil {
			return err
		}
	}
	return bw.Flush()
}

// verifyError is a break in the chain the verifier found.
type verifyError struct{ err error }

func (e *verifyError) Error() string { return e.err.Error() }

// verifyLive checks the kept log where it is: the archive's segments,
// then Redis.
func verifyLive(ctx context.Context, st *auditlog.Log, archive audit.Archive, chain *audit.Chain) (int, error) {
	var v *audit.Verifier
	err := audit.Walk(ctx, st, archive, func(cp *audit.Checkpoint) error {
		var err error
		if v, err = chain.NewVerifier(cp); err != nil {
			return &verifyError{err}
		}
		return nil
	}, func(_ []byte, e audit.Entry) error {
		if err := v.Next(e); err != nil {
			return &verifyError{err}
		}
		return nil
	})
	if err != nil {
		return 0, err
	}
	return v.Count(), nil
}

func writeLine(w *bufio.Writer, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	_, err = w.Write(append(b, '\n'))
	return err
}

// verifyLines checks an export; the error names the first bad entry.
func verifyLines(chain *audit.Chain, r io.Reader) (int, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	var v *audit.Verifier
	line := 0
	for sc.Scan() {
		line++
		text := strings.TrimSpace(sc.Text())
		if text == "" {
			continue
		}
		var l struct {
			Checkpoint *audit.Checkpoint `json:"checkpoint"`
		}
		if err := json.Unmarshal([]byte(text), &l); err != nil {
			return 0, fmt.Errorf("line %d is not JSON", line)
		}
		if l.Checkpoint != nil {
			if v != nil {
				return 0, fmt.Errorf("line %d: a checkpoint after the first entry", line)
			}
			var err error
			if v, err = chain.NewVerifier(l.Checkpoint); err != nil {
				return 0, fmt.Errorf("line %d: %w", line, err)
			}
			continue
		}
		if v == nil {
			v, _ = chain.NewVerifier(nil)
		}
		var e audit.Entry
		if err := json.Unmarshal([]byte(text), &e); err != nil {
			return 0, fmt.Errorf("line %d is not an entry", line)
		}
		if err := v.Next(e); err != nil {
			return 0, fmt.Errorf("line %d: %w", line, err)
		}
	}
	if err := sc.Err(); err != nil {
		return 0, err
	}
	if v == nil {
		return 0, nil
	}
	return v.Count(), nil
}

func report(n int, err error, stdout, stderr io.Writer) int {
	if err != nil {
		fmt.Fprintln(stderr, "audit: the chain is broken:", err)
		return 1
	}
	fmt.Fprintf(stdout, "audit: %d entries verified: the chain is intact\n", n)
	return 0
}
