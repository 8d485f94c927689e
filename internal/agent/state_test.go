package agent

import (
	"bytes"
	"context"
	"errors"
	"io"
	"slices"
	"strings"
	"testing"
	"testing/iotest"
	"time"
)

// runCell runs a kept-state cell and fails the test unless it exits 0.
func runCell(t *testing.T, c *Conn, code string) outcome {
	t.Helper()
	o := runOnce(t, c, Run{Code: code, KeepState: true}, "")
	if o.failed != "" || o.exit.ExitCode != 0 {
		t.Fatalf("cell %q: %+v", code, o)
	}
	return o
}

// TestStateSavedAndRestored: a snapshot of one sandbox's kept interpreter,
// restored in another's, brings back its variables (shared objects shared
// still, modules imported again), names what it could not keep, and the
// next cell finds the state kept.
func TestStateSavedAndRestored(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	a := startPythonAgent(t)
	if _, err := a.SaveState(ctx, &bytes.Buffer{}); !errors.Is(err, ErrNoState) {
		t.Fatalf("save without a kernel: %v, want ErrNoState", err)
	}
	runCell(t, a, "import fractions, os.path as osp\n"+
		"x = [1, 2, 3]\ny = x\nhalf = fractions.Fraction(1, 2)\n"+
		"big = bytes(3 << 20)\nimport socket\nconn = socket.socket()\n"+
		"gen = (i for i in range(3))")
	var snap bytes.Buffer
	saved, err := a.SaveState(ctx, &snap)
	if err != nil {
		t.Fatalf("save: %v", err)
	}
	slices.Sort(saved.Lost)
	if saved.Saved != 4 || !slices.Equal(saved.Lost, []string{"conn", "gen"}) || saved.LostCount != 2 {
		t.Errorf("saved %+v, want 4 saved, conn and gen lost", saved)
	}
	if snap.Len() < 3<<20 {
		t.Errorf("snapshot of %d bytes, want the 3 MiB variable in it", snap.Len())
	}
	// The first sandbox's interpreter goes on as it was.
	if o := runCell(t, a, "print(type(conn).__name__, len(x))"); o.stdout != "socket 3\n" || o.exit.Kernel != KernelKept {
		t.Errorf("after the save: %+v", o)
	}

	b := startPythonAgent(t)
	restored, err := b.RestoreState(ctx, bytes.NewReader(snap.Bytes()), false)
	if err != nil {
		t.Fatalf("restore: %v", err)
	}
	slices.Sort(restored.Lost)
	if restored.Restored != 4 || !slices.Equal(restored.Lost, []string{"conn", "gen"}) {
		t.Errorf("restored %+v, want 4 restored, conn and gen lost", restored)
	}
	o := runCell(t, b, "x.append(4)\nprint(y, y is x, half * 2, len(big), osp.join('a', 'b'), 'conn' in globals())")
	if o.stdout != "[1, 2, 3, 4] True 1 3145728 a/b False\n" || o.exit.Kernel != KernelKept || o.exit.StateLost {
		t.Errorf("after the restore: stdout %q exit %+v", o.stdout, o.exit)
	}
	if _, err := b.RestoreState(ctx, bytes.NewReader(snap.Bytes()), false); err == nil {
		t.Error("a restore over a live kernel was accepted")
	}
}

// TestStateRestoreRefusesGarbage: what is not a snapshot starts no
// kernel, and the next cell starts a fresh one; a snapshot cut short
// restores nothing.
func TestStateRestoreRefusesGarbage(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	a := startPythonAgent(t)
	runCell(t, a, "kept = 'yes'\nmore = list(range(100000))")
	var snap bytes.Buffer
	if _, err := a.SaveState(ctx, &snap); err != nil {
		t.Fatal(err)
	}
	broken := errors.New("the store failed")
	for name, data := range map[string]io.Reader{
		"garbage": strings.NewReader("not a snapshot at all"),
		"cut":     bytes.NewReader(snap.Bytes()[:snap.Len()/2]),
		// The executor's read fails: the agent gets no end of chunks.
		"unended": io.MultiReader(bytes.NewReader(snap.Bytes()[:snap.Len()-10]), iotest.ErrReader(broken)),
	} {
		t.Run(name, func(t *testing.T) {
			b := startPythonAgent(t)
			if _, err := b.RestoreState(ctx, data, false); err == nil {
				t.Fatal("restore accepted")
			}
			o := runCell(t, b, "print('kept' in globals())")
			if o.stdout != "False\n" || o.exit.Kernel != KernelNew {
				t.Errorf("after a refused restore: %+v", o)
			}
		})
	}
}

// TestStateSaveCancelled: a save whose context ends leaves the kernel as
// it was.
func TestStateSaveCancelled(t *testing.T) {
	a := startPythonAgent(t)
	runCell(t, a, "big = bytes(64 << 20)")
	ctx, cancel := context.WithCancel(context.Background())
	w := writerFunc(func(p []byte) (int, error) { cancel(); return len(p), nil })
	if _, err := a.SaveState(ctx, w); !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled save: %v", err)
	}
	if o := runCell(t, a, "print(len(big))"); !strings.HasPrefix(o.stdout, "67108864") || o.exit.Kernel != KernelKept {
		t.Errorf("after a cancelled save: %+v", o)
	}
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }
