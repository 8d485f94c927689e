package snapshot

import (
	"bytes"
	"context"
	"errors"
	"io"
	"log/slog"
	"sync"
	"testing"

	"github.com/runbox-dev/runbox"
	"github.com/runbox-dev/runbox/internal/agent"
	"github.com/runbox-dev/runbox/internal/files"
)

// versions is Versions in memory, as the store's scripts behave.
type versions struct {
	mu  sync.Mutex
	gen map[string]int64
	rec map[string][]byte
}

func (v *versions) KeptStarted(_ context.Context, conv string) (int64, []byte, error) {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.gen[conv]++
	rec := v.rec[conv]
	delete(v.rec, conv)
	return v.gen[conv], rec, nil
}

func (v *versions) KeptSaved(_ context.Context, conv string, gen int64, rec []byte) (bool, error) {
	v.mu.Lock()
	defer v.mu.Unlock()
	if v.gen[conv] != gen {
		return false, nil
	}
	v.rec[conv] = rec
	return true, nil
}

func (v *versions) KeptLast(_ context.Context, conv string) (int64, []byte, error) {
	v.mu.Lock()
	defer v.mu.Unlock()
	return v.gen[conv], v.rec[conv], nil
}

// interp is an interpreter whose state is bytes.
type interp struct {
	state    []byte
	restored []byte
}

func (i *interp) SaveState(_ context.Context, w io.Writer) (agent.StateSaved, error) {
	if i.state == nil {
		return agent.StateSaved{}, agent.ErrNoState
	}
	_, err := w.Write(i.state)
	return agent.StateSaved{Saved: 1, Lost: []string{"sock"}, LostCount: 1}, err
}

func (i *interp) RestoreState(_ context.Context, r io.Reader, _ bool) (agent.StateRestored, error) {
	b, err := io.ReadAll(r)
	if err != nil {
		return agent.StateRestored{}, err
	}
	i.restored = b
	return agent.StateRestored{Restored: 1}, nil
}

func newKeeper(t *testing.T, quota int64) (*Keeper, *files.Folders) {
	t.Helper()
	f, err := files.NewFolders(t.TempDir(), files.Options{Quota: quota, Mode: files.QuotaWalk, UID: -1, GID: -1})
	if err != nil {
		t.Fatal(err)
	}
	v := &versions{gen: map[string]int64{}, rec: map[string][]byte{}}
	return NewKeeper(f, v, []byte("secret"), slog.New(slog.DiscardHandler)), f
}

// TestKeeperPauseResume: a paused interpreter's state comes back in the
// conversation's next one, once; it counts in the quota while stored,
// is sealed there, and an interpreter superseded meanwhile saves nothing.
func TestKeeperPauseResume(t *testing.T) {
	ctx := context.Background()
	k, f := newKeeper(t, 1<<20)
	conv := "~acme~c1"
	first, err := k.Resume(ctx, conv, &interp{})
	if err != nil || first.Restored {
		t.Fatalf("first resume: %+v, %v", first, err)
	}
	state := bytes.Repeat([]byte("kept "), 1000)
	p, err := k.Pause(ctx, conv, first.Gen, &interp{state: state})
	if err != nil || p.Saved.LostCount != 1 {
		t.Fatalf("pause: %+v, %v", p, err)
	}
	if used, _, _ := f.Usage(conv); used != p.Size || p.Size < int64(len(state)) {
		t.Errorf("usage %d after a pause of %d bytes", used, p.Size)
	}
	blob, _ := f.OpenState(ctx, conv)
	stored, _ := io.ReadAll(blob)
	blob.Close()
	if bytes.Contains(stored, state[:50]) {
		t.Error("the stored snapshot holds the state in the clear")
	}

	next := &interp{}
	r, err := k.Resume(ctx, conv, next)
	if err != nil || !r.Restored || !bytes.Equal(next.restored, state) || r.Gen != first.Gen+1 {
		t.Fatalf("resume: %+v, %v, %d bytes", r, err, len(next.restored))
	}
	if used, _, _ := f.Usage(conv); used != 0 {
		t.Errorf("usage %d after the restore, want the snapshot's room back", used)
	}
	// Once restored, never again: the next start is fresh.
	if again, err := k.Resume(ctx, conv, &interp{}); err != nil || again.Restored {
		t.Errorf("second resume: %+v, %v", again, err)
	}
	// r's interpreter is superseded by that start: its pause is refused.
	if _, err := k.Pause(ctx, conv, r.Gen, &interp{state: state}); !errors.Is(err, ErrSuperseded) {
		t.Errorf("pause of a superseded interpreter: %v", err)
	}
}

// TestKeeperQuota: a snapshot larger than the room the conversation's
// files leave is not stored, nor restored.
func TestKeeperQuota(t *testing.T) {
	ctx := context.Background()
	k, f := newKeeper(t, 4096)
	conv := "c2"
	r, _ := k.Resume(ctx, conv, &interp{})
	if _, err := k.Pause(ctx, conv, r.Gen, &interp{state: make([]byte, 8192)}); err == nil {
		t.Fatal("a snapshot over the quota was stored")
	}
	if _, err := f.OpenState(ctx, conv); !errors.Is(err, runbox.ErrFileNotFound) {
		t.Errorf("after a refused pause: %v", err)
	}
	if again, _ := k.Resume(ctx, conv, &interp{}); again.Restored {
		t.Error("restored a refused snapshot")
	}
}

// TestKeeperOtherConversation: a snapshot copied into another
// conversation's place does not open there.
func TestKeeperOtherConversation(t *testing.T) {
	ctx := context.Background()
	k, f := newKeeper(t, 1<<20)
	a, _ := k.Resume(ctx, "~acme~a", &interp{})
	if _, err := k.Pause(ctx, "~acme~a", a.Gen, &interp{state: []byte("a's secrets")}); err != nil {
		t.Fatal(err)
	}
	b, _ := k.Resume(ctx, "~evil~b", &interp{})
	if _, err := k.Pause(ctx, "~evil~b", b.Gen, &interp{state: []byte("b")}); err != nil {
		t.Fatal(err)
	}
	blob, _ := f.OpenState(ctx, "~acme~a")
	stolen, _ := io.ReadAll(blob)
	blob.Close()
	if _, err := f.PutState(ctx, "~evil~b", bytes.NewReader(stolen), 1<<20); err != nil {
		t.Fatal(err)
	}
	victim := &interp{}
	if _, err := k.Resume(ctx, "~evil~b", victim); err == nil || victim.restored != nil {
		t.Errorf("another conversation's snapshot was restored: %q", victim.restored)
	}
}

// TestKeeperFork: a fork gets the source's saved state, sealed anew for
// itself: its first interpreter restores it, the source's next one still
// does too, and neither's blob opens in the other; a source without a
// saved state (never had one, or one running) gives none; a fork whose
// quota has no room for it gets none.
func TestKeeperFork(t *testing.T) {
	ctx := context.Background()
	k, f := newKeeper(t, 4<<20)
	src, fork := "~acme~src", "~acme~fork"
	if _, err := k.Fork(ctx, src, fork); !errors.Is(err, ErrNoSnapshot) {
		t.Fatalf("fork of a conversation without kept state: %v", err)
	}
	if saved, had, _ := k.Saved(ctx, src); saved || had {
		t.Errorf("saved %v, had %v before any interpreter", saved, had)
	}
	first, _ := k.Resume(ctx, src, &interp{})
	if saved, had, _ := k.Saved(ctx, src); saved || !had {
		t.Errorf("saved %v, had %v with an interpreter running", saved, had)
	}
	if _, err := k.Fork(ctx, src, fork); !errors.Is(err, ErrNoSnapshot) {
		t.Fatalf("fork of a running interpreter: %v", err)
	}
	state := bytes.Repeat([]byte("df "), 400_000) // more than a chunk
	if _, err := k.Pause(ctx, src, first.Gen, &interp{state: state}); err != nil {
		t.Fatal(err)
	}
	if saved, _, _ := k.Saved(ctx, src); !saved {
		t.Error("not saved after a pause")
	}
	size, err := k.Fork(ctx, src, fork)
	if err != nil || size < int64(len(state)) {
		t.Fatalf("fork: %d bytes, %v", size, err)
	}
	if used, _, _ := f.Usage(fork); used != size {
		t.Errorf("the fork's usage is %d, its state %d bytes", used, size)
	}
	a, _ := readAll(ctx, f, src)
	b, _ := readAll(ctx, f, fork)
	if bytes.Equal(a[:256], b[:256]) {
		t.Error("the fork's snapshot has the source's header: not sealed anew")
	}
	// A fork's state is its own: the source's sealed bytes do not open
	// in the fork.
	if _, err := Open(bytes.NewReader(a), k.secret, fork, 0); err == nil {
		t.Error("the source's snapshot opens as the fork's")
	}
	// Forked from the fork before it ran: carried on.
	if _, err := k.Fork(ctx, fork, "~acme~grandchild"); err != nil {
		t.Errorf("fork of a fork not resumed yet: %v", err)
	}
	for _, conv := range []string{fork, src, "~acme~grandchild"} {
		in := &interp{}
		r, err := k.Resume(ctx, conv, in)
		if err != nil || !r.Restored || !bytes.Equal(in.restored, state) {
			t.Errorf("%s: resume %+v, %v, %d bytes", conv, r, err, len(in.restored))
		}
	}
}

// TestKeeperForkQuota: a fork whose quota has no room for the state gets
// none, and nothing of it is stored.
func TestKeeperForkQuota(t *testing.T) {
	ctx := context.Background()
	k, f := newKeeper(t, 8192)
	src, fork := "~acme~src", "~acme~fork"
	r, _ := k.Resume(ctx, src, &interp{})
	if _, err := k.Pause(ctx, src, r.Gen, &interp{state: make([]byte, 6000)}); err != nil {
		t.Fatal(err)
	}
	if _, err := f.Write(fork, "big", bytes.NewReader(make([]byte, 4000)), 1<<20, false); err != nil {
		t.Fatal(err)
	}
	if _, err := k.Fork(ctx, src, fork); err == nil {
		t.Fatal("a state over the fork's quota was forked")
	}
	if _, err := f.OpenState(ctx, fork); !errors.Is(err, runbox.ErrFileNotFound) {
		t.Errorf("after a refused fork: %v", err)
	}
	if again, _ := k.Resume(ctx, fork, &interp{}); again.Restored {
		t.Error("the fork restored a refused state")
	}
}

func readAll(ctx context.Context, f *files.Folders, conv string) ([]byte, error) {
	blob, err := f.OpenState(ctx, conv)
	if err != nil {
		return nil, err
	}
	defer blob.Close()
	return io.ReadAll(blob)
}
