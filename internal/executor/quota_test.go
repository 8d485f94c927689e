package executor

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"

	"github.com/runbox-dev/runbox"
	"github.com/runbox-dev/runbox/internal/files"
	"github.com/runbox-dev/runbox/internal/sandbox"
)

// TestWatchQuota: the watch's stop reports a run whose files went past the
// quota whenever a measurement found it there — before the run ended, or
// only the last one as it ends — and a run that added to a conversation
// already past it, never one that did not add to it.
func TestWatchQuota(t *testing.T) {
	const quota = 8 << 20
	tests := []struct {
		name           string
		before, during int64 // bytes written before the watch and while it runs
		tick           bool  // a measurement falls while the run's files are past the quota
		sparse         bool  // what the run writes is a hole: one truncate, no block
		want           bool
	}{
		{name: "within the quota", during: 4 << 20},
		{name: "past it, no measurement in the run", during: 12 << 20, want: true},
		{name: "past it, found by a measurement after the program ended", during: 12 << 20, tick: true, want: true},
		{name: "past it already, nothing added", before: 12 << 20},
		{name: "past it already, more added", before: 12 << 20, during: 4 << 20, want: true},
		// It counts whole: a copy that cannot keep its holes writes them.
		{name: "past it with a sparse file", during: 1 << 40, sparse: true, tick: true, want: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			folders, err := files.NewFolders(t.TempDir(), files.Options{UID: sandbox.UID, GID: sandbox.GID,
				Quota: quota, Files: 1000, Mode: files.QuotaWalk})
			if err != nil {
				t.Fatal(err)
			}
			const cid = "conv"
			dir, err := folders.Ensure(cid)
			if err != nil {
				t.Fatal(err)
			}
			write := func(name string, n int64) {
				var err error
				switch {
				case n > 0 && tt.sparse:
					err = os.WriteFile(filepath.Join(dir, name), nil, 0o644)
					if err == nil {
						err = os.Truncate(filepath.Join(dir, name), n)
					}
				case n > 0:
					err = os.WriteFile(filepath.Join(dir, name), make([]byte, n), 0o644)
				}
				if err != nil {
					t.Fatal(err)
				}
			}
			write("before", tt.before)
			clock := clockwork.NewFakeClock()
			e := &Executor{cfg: Config{Clock: clock}, folders: folders}
			ctx, cancel := context.WithCancelCause(context.Background())
			defer cancel(nil)
			stop := e.watchQuota(ctx, cid, cancel)
			write("during", tt.during)
			if tt.tick {
				if err := clock.BlockUntilContext(ctx, 1); err != nil {
					t.Fatal(err)
				}
				clock.Advance(quotaCheckInterval)
				select {
				case <-ctx.Done():
				case <-time.After(10 * time.Second):
					t.Fatal("the measurement did not stop the run")
				}
				if !errors.Is(context.Cause(ctx), errQuota) {
					t.Fatalf("stopped for %v", context.Cause(ctx))
				}
			}
			if got := stop(); got != tt.want {
				t.Errorf("stop() = %v, want %v", got, tt.want)
			}
		})
	}
}

// TestStoreMessage: a copy to or from the file store refused for the
// quota tells the run's client so; any other failure says what failed,
// never its error (which may name the host's paths).
func TestStoreMessage(t *testing.T) {
	quota := runbox.Errorf(runbox.EQuotaExceeded, "the conversation's files take 6 bytes, more than its quota of 1")
	tests := []struct {
		err  error
		want string
	}{
		{quota, quota.Message},
		{fmt.Errorf("push: %w", quota), quota.Message},
		{errors.New("open /srv/runbox/conv/files: EIO"), "could not save"},
	}
	for _, tt := range tests {
		if got := storeMessage("could not save", tt.err); got != tt.want {
			t.Errorf("storeMessage(%v) = %q, want %q", tt.err, got, tt.want)
		}
	}
}
