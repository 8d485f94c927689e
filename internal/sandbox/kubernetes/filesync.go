package kubernetes

import (
	"bufio"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/runbox-dev/runbox/internal/agent"
)

// The executor's sandbox manager runs programs in a folder it shares
// with the sandbox (Docker's bind mount): it writes the conversation's
// files there before a run and reads what the run left after. A pod
// shares no folder, so the engine carries the files at those moments,
// watching the agent's protocol go by: before a run's frame reaches the
// agent the folder is copied in (if it changed since the last copy), and
// before a run's exit reaches the manager /data is copied out. The
// manager sees a stream as Docker's.

// Frame types of the agent's protocol (package agent, frame.go) the
// copies wait on: a run's start, and its end.
const (
	frameRun  = 'R'
	frameExit = 'x'
)

// copier copies a sandbox's files in and out: in before a run, out
// after one, given the run's exit (agent.Exit's JSON).
type copier interface {
	copyIn() error
	copyOut(exit []byte) error
}

// syncedStream is a sandbox's stream with its files carried around runs.
type syncedStream struct {
	out *io.PipeReader // to the manager, exits held until copied out
	in  *io.PipeWriter // from the manager, runs held until copied in
}

// syncFiles wraps s: reads and writes pass through, and c copies the
// files around each run. A failed copy, either way, ends the stream both
// ways (the sandbox is then of no use: its files and the folder
// disagree): the manager reads the copy's error at once. A run whose copy
// in failed was taken whole by the pipe before the copy began, so it is
// never sent on; without the end of the manager's reads too, it would
// wait for that run's output until the run's timeout.
func syncFiles(s io.ReadWriter, c copier) *syncedStream {
	outR, outW := io.Pipe()
	inR, inW := io.Pipe()
	end := func(err error) {
		outW.CloseWithError(err)
		inR.CloseWithError(err)
	}
	go func() { end(relay(bufio.NewReader(s), outW, frameExit, c.copyOut)) }()
	go func() { end(relay(bufio.NewReader(inR), s, frameRun, func([]byte) error { return c.copyIn() })) }()
	return &syncedStream{out: outR, in: inW}
}

func (s *syncedStream) Read(p []byte) (int, error)  { return s.out.Read(p) }
func (s *syncedStream) Write(p []byte) (int, error) { return s.in.Write(p) }

// Close ends both directions.
func (s *syncedStream) Close() error {
	s.in.Close()
	s.out.Close()
	return nil
}

// relay copies frames from r to w, calling before with the payload of
// each frame of type typ ahead of it.
func relay(r *bufio.Reader, w io.Writer, typ byte, before func(payload []byte) error) error {
	var hdr [5]byte
	for {
		if _, err := io.ReadFull(r, hdr[:]); err != nil {
			return err
		}
		n := binary.BigEndian.Uint32(hdr[1:])
		if n > agent.MaxPayload {
			return agent.ErrFrameTooLarge
		}
		if hdr[0] != typ {
			if _, err := w.Write(hdr[:]); err != nil {
				return err
			}
			if _, err := io.CopyN(w, r, int64(n)); err != nil {
				return err
			}
			continue
		}
		frame := make([]byte, len(hdr)+int(n))
		copy(frame, hdr[:])
		if _, err := io.ReadFull(r, frame[len(hdr):]); err != nil {
			return err
		}
		if err := before(frame[len(hdr):]); err != nil {
			return err
		}
		if _, err := w.Write(frame); err != nil {
			return err
		}
	}
}

// folderCopier copies between a sandbox's /data and the executor's
// folder dir, in only when dir changed since the last copy.
type folderCopier struct {
	e     *Engine
	pod   string
	dir   *heldFolder
	quota agent.Quota // CopyOut's, and the most a copy in carries

	mu   sync.Mutex
	last map[string]entryState // dir as the last copy left it, by relative name
	// outSum is the sandbox's /data's sum (agent.Exit.DataSum) when it
	// was last copied out, "" after a copy in: a run that ends with the
	// same sum changed nothing there, and its copy out (an exec through
	// the API server, ~100 ms) is skipped.
	outSum string
}

// heldFolder is the executor's folder of a sandbox, held open. The
// executor gives a pooled sandbox to a new conversation by renaming the
// sandbox's folder (a slot) to the conversation's (package files): a
// Docker bind mount follows the directory, not its path, and so does a
// heldFolder, its path read back from the open directory at each copy.
type heldFolder struct{ f *os.File }

func holdFolder(dir string) (*heldFolder, error) {
	f, err := os.Open(dir)
	if err != nil {
		return nil, fmt.Errorf("kubernetes: open the sandbox's folder: %w", err)
	}
	return &heldFolder{f: f}, nil
}

// path returns where the folder is now.
func (h *heldFolder) path() (string, error) {
	p, err := os.Readlink("/proc/self/fd/" + strconv.Itoa(int(h.f.Fd())))
	if err != nil {
		return "", fmt.Errorf("kubernetes: find the sandbox's folder: %w", err)
	}
	if strings.HasSuffix(p, " (deleted)") {
		return "", errors.New("kubernetes: the sandbox's folder was removed")
	}
	return p, nil
}

func (h *heldFolder) Close() error { return h.f.Close() }

// copyTimeout bounds one copy.
const copyTimeout = 2 * time.Minute

// entryState is what tells a folder's entry changed.
type entryState struct {
	mode  fs.FileMode
	size  int64
	mtime time.Time
}

func (f *folderCopier) copyIn() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	dir, err := f.dir.path()
	if err != nil {
		return err
	}
	now, err := snapshot(dir)
	if err != nil {
		return err
	}
	if f.last != nil && maps.Equal(now, f.last) {
		return nil
	}
	if err := f.fits(now); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), copyTimeout)
	defer cancel()
	if err := f.e.CopyIn(ctx, f.pod, dir); err != nil {
		return err
	}
	f.last, f.outSum = now, ""
	return nil
}

// fits checks, before anything is copied in, that the folder's files fit
// the sandbox's /data: tar carries every file whole, holes as zeros, and
// the pod writes them all.
func (f *folderCopier) fits(entries map[string]entryState) error {
	var size int64
	for _, e := range entries {
		size += e.size
	}
	if limit := f.quota.Bytes; limit > 0 && size > limit {
		return fmt.Errorf("%w: the folder's files take %d bytes, each whole however sparse; /data holds %d", ErrTooLarge, size, limit)
	}
	return nil
}

func (f *folderCopier) copyOut(exit []byte) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	ex := exitOf(exit)
	if ex.Quota != "" {
		// Its files passed their quota, and the agent stopped the
		// program: none of them is taken, the folder stays as the run
		// found it (the manager removes the sandbox; were it used
		// again, its /data would be made the folder's first).
		f.last, f.outSum = nil, ""
		return nil
	}
	if f.unchanged(ex.DataSum) {
		return nil
	}
	dir, err := f.dir.path()
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), copyTimeout)
	defer cancel()
	if err := f.e.CopyOut(ctx, f.pod, dir, f.quota); err != nil {
		return err
	}
	now, err := snapshot(dir)
	if err != nil {
		return err
	}
	f.last, f.outSum = now, ex.DataSum
	return nil
}

// startEmpty notes, for a new pod, that its /data (an empty emptyDir)
// matches the folder dir if dir is empty too: a pooled pod's folder is,
// and so is a new conversation's that adopts it, whose first run then
// needs no copy in (an exec through the API server, ~100 ms). Where dir
// cannot be read, the first run copies, as it would without this.
func (f *folderCopier) startEmpty(dir string) {
	if entries, err := os.ReadDir(dir); err != nil || len(entries) > 0 {
		return
	}
	if now, err := snapshot(dir); err == nil {
		f.mu.Lock()
		f.last = now
		f.mu.Unlock()
	}
}

// exitOf is a run's exit as its frame's payload says, or none (then
// copied out, as an exit without a sum) if it does not parse.
func exitOf(payload []byte) agent.Exit {
	var ex agent.Exit
	if json.Unmarshal(payload, &ex) != nil {
		return agent.Exit{}
	}
	return ex
}

// unchanged reports whether sum, a run's exit's, is the sum of the
// sandbox's /data the last copy out left.
func (f *folderCopier) unchanged(sum string) bool { return sum != "" && sum == f.outSum }

// snapshot lists a folder's entries, by name relative to it, with what
// tells them changed.
func snapshot(dir string) (map[string]entryState, error) {
	out := map[string]entryState{}
	err := filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		st := entryState{mode: info.Mode()}
		if info.Mode().IsRegular() {
			st.size, st.mtime = info.Size(), info.ModTime()
		}
		rel, err := filepath.Rel(dir, path)
		if err != nil {
			return err
		}
		out[rel] = st
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("kubernetes: list the working copy: %w", err)
	}
	return out, nil
}
