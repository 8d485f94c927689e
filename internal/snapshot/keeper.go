package snapshot

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/runbox-dev/runbox/internal/agent"
)

// Blobs keep sealed snapshots in conversations' storage (the host folder,
// or S3), one per conversation, under a name no sandbox mounts, counted
// in the conversation's quota.
type Blobs interface {
	// PutState stores what r yields as the conversation's snapshot, in
	// place of the one it had, or fails past limit bytes (a quota error),
	// storing nothing.
	PutState(ctx context.Context, conv string, r io.Reader, limit int64) (int64, error)
	// OpenState opens the conversation's snapshot; a missing one is an
	// error errors.Is(runbox.ENotFound)… reported as ErrNoSnapshot.
	OpenState(ctx context.Context, conv string) (io.ReadCloser, error)
	// RemoveState removes the conversation's snapshot, if any.
	RemoveState(ctx context.Context, conv string) error
	// StateRoom returns how many bytes the conversation's snapshot may
	// take: its quota less its files.
	StateRoom(ctx context.Context, conv string) (int64, error)
}

// Versions count a conversation's interpreters (generations) and record
// its saved snapshot, so that none is restored once a newer interpreter
// has started: the one restored from it, or a fresh one elsewhere.
type Versions interface {
	// KeptStarted records that an interpreter of the conversation starts
	// and returns its generation, and the record Saved left, if any (nil):
	// from now on no Saved of an earlier generation is taken.
	KeptStarted(ctx context.Context, conv string) (gen int64, saved []byte, err error)
	// KeptSaved records rec as the conversation's saved snapshot, that of
	// generation gen, unless a newer interpreter has started; it reports
	// whether it did.
	KeptSaved(ctx context.Context, conv string, gen int64, rec []byte) (bool, error)
	// KeptLast returns the generation of the conversation's last
	// interpreter (0 for none) and the record Saved left, if any (nil),
	// taking nothing.
	KeptLast(ctx context.Context, conv string) (gen int64, saved []byte, err error)
}

// Record is a saved snapshot as Versions keeps it.
type Record struct {
	Gen   int64     `json:"gen"`
	Size  int64     `json:"size"`
	Heavy bool      `json:"heavy,omitempty"`
	At    time.Time `json:"at"`
}

// Interpreter is a sandbox's agent, as far as snapshots go.
type Interpreter interface {
	SaveState(ctx context.Context, w io.Writer) (agent.StateSaved, error)
	RestoreState(ctx context.Context, r io.Reader, heavy bool) (agent.StateRestored, error)
}

// Errors of Pause.
var (
	// ErrSuperseded reports an interpreter newer than the one asked to
	// pause: its state is not the conversation's any more.
	ErrSuperseded = errors.New("snapshot: a newer interpreter of the conversation has started")
	// ErrNoSnapshot reports a conversation without a saved snapshot.
	ErrNoSnapshot = errors.New("snapshot: none saved")
)

// Keeper pauses and resumes conversations' kept interpreters.
type Keeper struct {
	blobs    Blobs
	versions Versions
	secret   []byte
	log      *slog.Logger
}

// NewKeeper keeps snapshots in blobs, sealed with keys derived from
// secret.
func NewKeeper(blobs Blobs, versions Versions, secret []byte, log *slog.Logger) *Keeper {
	return &Keeper{blobs: blobs, versions: versions, secret: secret, log: log}
}

// Paused is what a pause kept.
type Paused struct {
	Gen   int64
	Size  int64 // sealed bytes stored
	Saved agent.StateSaved
}

// Pause saves the state of the conversation's interpreter of generation
// gen, which in's sandbox holds. agent.ErrNoState when it has none;
// ErrSuperseded when a newer one has started.
func (k *Keeper) Pause(ctx context.Context, conv string, gen int64, in Interpreter) (Paused, error) {
	var saved agent.StateSaved
	size, err := k.put(ctx, conv, gen, func(w io.Writer) error {
		var err error
		saved, err = in.SaveState(ctx, w)
		return err
	})
	if err != nil {
		return Paused{}, err
	}
	if err := k.record(ctx, conv, Record{Gen: gen, Size: size, Heavy: saved.Heavy, At: time.Now()}); err != nil {
		return Paused{}, err
	}
	return Paused{Gen: gen, Size: size, Saved: saved}, nil
}

// put stores what write writes as the conversation's snapshot of
// generation gen, sealed, within the room its quota leaves; it returns
// the sealed bytes stored. Nothing is stored when write fails.
func (k *Keeper) put(ctx context.Context, conv string, gen int64, write func(io.Writer) error) (int64, error) {
	room, err := k.blobs.StateRoom(ctx, conv)
	if err != nil {
		return 0, err
	}
	pr, pw := io.Pipe()
	stored := make(chan error, 1)
	var size int64
	go func() {
		n, err := k.blobs.PutState(ctx, conv, pr, room)
		size = n
		pr.CloseWithError(err) // a writer blocked on a failed put goes on
		stored <- err
	}()
	seal, err := Seal(pw, k.secret, conv, uint64(gen))
	if err != nil {
		pw.CloseWithError(err)
		<-stored
		return 0, err
	}
	err = write(seal)
	if err == nil {
		err = seal.Close()
	}
	pw.CloseWithError(err) // nil: the end; else no snapshot is stored
	if serr := <-stored; err == nil {
		err = serr
	}
	return size, err
}

// record records rec as the conversation's saved snapshot; ErrSuperseded
// when a newer interpreter than rec's has started.
func (k *Keeper) record(ctx context.Context, conv string, rec Record) error {
	raw, _ := json.Marshal(rec)
	ok, err := k.versions.KeptSaved(ctx, conv, rec.Gen, raw)
	if err != nil {
		return err
	}
	if !ok {
		return ErrSuperseded
	}
	return nil
}

// Saved reports whether the conversation's last interpreter has its state
// saved (its snapshot restores in the next one), and whether it ever had
// one: an interpreter that may run now has had, and is not saved.
func (k *Keeper) Saved(ctx context.Context, conv string) (saved, had bool, err error) {
	gen, raw, err := k.versions.KeptLast(ctx, conv)
	if err != nil {
		return false, false, err
	}
	_, ok := last(gen, raw)
	return ok, gen > 0, nil
}

// last returns the record raw holds if it is that of the interpreter of
// generation gen.
func last(gen int64, raw []byte) (Record, bool) {
	var rec Record
	if raw == nil || json.Unmarshal(raw, &rec) != nil || rec.Gen != gen {
		return Record{}, false
	}
	return rec, true
}

// Fork gives the conversation to, new, the saved snapshot of the
// conversation from's last interpreter, which its first interpreter then
// restores: opened with from's key and sealed anew with to's, for to's
// generation, here and never in a sandbox, within the room to's quota
// leaves. It returns the sealed bytes stored; ErrNoSnapshot when from's
// last interpreter has none saved (it never had one, runs still, or was
// restored already).
func (k *Keeper) Fork(ctx context.Context, from, to string) (int64, error) {
	gen, raw, err := k.versions.KeptLast(ctx, from)
	if err != nil {
		return 0, err
	}
	src, ok := last(gen, raw)
	if !ok {
		return 0, ErrNoSnapshot
	}
	toGen, _, err := k.versions.KeptLast(ctx, to)
	if err != nil {
		return 0, err
	}
	blob, err := k.blobs.OpenState(ctx, from)
	if err != nil {
		return 0, fmt.Errorf("fork state: %w", err)
	}
	defer blob.Close()
	plain, err := Open(blob, k.secret, from, uint64(src.Gen))
	if err != nil {
		return 0, fmt.Errorf("fork state: %w", err)
	}
	size, err := k.put(ctx, to, toGen, func(w io.Writer) error {
		_, err := io.Copy(w, plain)
		return err
	})
	if err != nil {
		return 0, fmt.Errorf("fork state: %w", err)
	}
	if err := k.record(ctx, to, Record{Gen: toGen, Size: size, Heavy: src.Heavy, At: time.Now()}); err != nil {
		return 0, errors.Join(err, k.blobs.RemoveState(context.WithoutCancel(ctx), to))
	}
	return size, nil
}

// Resumed is what a resume brought back.
type Resumed struct {
	// Gen is the generation of the sandbox's interpreter from now on.
	Gen int64
	// Restored is set when a snapshot was restored: its state lives on.
	Restored bool
	State    agent.StateRestored
}

// Resume starts the conversation's next interpreter in in's sandbox,
// which has none: restored from the conversation's snapshot when it has
// one of the interpreter before, else fresh (by the next cell). An error
// says the snapshot could not be restored; Gen is valid all the same.
func (k *Keeper) Resume(ctx context.Context, conv string, in Interpreter) (Resumed, error) {
	gen, raw, err := k.versions.KeptStarted(ctx, conv)
	if err != nil {
		return Resumed{}, err
	}
	res := Resumed{Gen: gen}
	rec, ok := last(gen-1, raw)
	if !ok {
		// None, or of an interpreter that another has followed since: a
		// fresh one starts.
		return res, nil
	}
	blob, err := k.blobs.OpenState(ctx, conv)
	if err != nil {
		return res, err
	}
	defer blob.Close()
	plain, err := Open(blob, k.secret, conv, uint64(rec.Gen))
	if err != nil {
		return res, err
	}
	st, err := in.RestoreState(ctx, plain, rec.Heavy)
	if err != nil {
		return res, fmt.Errorf("restore: %w", err)
	}
	res.Restored, res.State = true, st
	// Its state lives in the interpreter now, and the snapshot can never
	// be restored again (its generation is not the last): its room goes
	// back to the conversation.
	if err := k.blobs.RemoveState(context.WithoutCancel(ctx), conv); err != nil {
		k.log.Warn("remove a restored snapshot", "conversation", conv, "err", err)
	}
	return res, nil
}
