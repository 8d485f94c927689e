// Package agent is the runner protocol between an executor and the agent
// process inside a sandbox, and both of its ends: Serve runs in the sandbox,
// Conn drives it from the executor.
//
// The protocol runs over the container's attached stdin and stdout, so it
// needs no network and no Docker API call per run. Every message is a frame:
// one type byte, a big-endian uint32 payload length, then the payload.
// Upper-case types flow into the sandbox, lower-case ones out of it.
package agent

import (
	"bufio"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sync"
)

// Version is the protocol version an agent announces in its hello. From
// version 2 on the protocol carries streams (mux.go).
const Version = 2

const (
	frameRun   = 'R' // executor → agent: JSON Run
	frameStdin = 'I' // executor → agent: bytes for the program's stdin
	frameEOF   = 'E' // executor → agent: close the program's stdin
	frameKill  = 'K' // executor → agent: kill the program and what it started
	frameTerm  = 'T' // executor → agent: ask the program and what it started to stop (SIGTERM)
	frameReset = 'Z' // executor → agent: reset the sandbox for another conversation (reset.go)
	// frameMuxIn ('M') and frameMuxOut ('m') carry streams (mux.go).

	frameHello  = 'h' // agent → executor: JSON Hello, once, first
	frameStdout = 'o' // agent → executor: program output
	frameStderr = 'e'
	frameExit   = 'x' // agent → executor: JSON Exit, once per run, last
	frameFail   = 'f' // agent → executor: JSON Failure; the run did not start
	frameReady  = 'z' // agent → executor: JSON Reset, the outcome of a reset
)

// MaxPayload bounds one frame. It is larger than any accepted program and
// keeps a hostile peer from making the reader allocate without limit.
const MaxPayload = 4 << 20

// chunkSize is the most program output one frame carries.
const chunkSize = 32 << 10

// ErrFrameTooLarge reports a frame whose announced length exceeds MaxPayload.
var ErrFrameTooLarge = errors.New("agent: frame too large")

// Run asks the agent to start a program.
type Run struct {
	Code string            `json:"code"`
	Env  map[string]string `json:"env,omitempty"`
	// KeepState runs the code as a cell of the sandbox's kept interpreter
	// (started for it if there is none), where what earlier cells defined
	// persists.
	KeepState bool `json:"keep_state,omitempty"`
	// Filesystem, when set, narrows what the program may read and write
	// (landlock.go); only for images that start programs directly.
	Filesystem *Rules `json:"filesystem,omitempty"`
	// Trust, when set, is a PEM certificate the program's TLS clients
	// trust besides the image's roots: the agent writes it, and a bundle
	// of it and the image's roots, where TrustEnv's variables say
	// (trust.go).
	Trust string `json:"trust,omitempty"`
}

// Hello is the agent's first frame.
type Hello struct {
	Version int `json:"version"`
}

// Exit reports how a program ended.
type Exit struct {
	// ExitCode is the program's exit status, or -1 when a signal ended it.
	ExitCode int `json:"exit_code"`
	// Signal is the number of the signal that ended the program, if any.
	Signal int `json:"signal,omitempty"`
	// OOMKilled is set when the kernel's OOM killer fired during the run.
	OOMKilled bool `json:"oom_killed,omitempty"`
	// Clean is set when, after the run, the agent found no process of the
	// program left in the sandbox. A sandbox whose agent does not say so
	// is not used again.
	Clean bool `json:"clean,omitempty"`
	// Kernel says, for a kept-state run, whether its interpreter was
	// started for it (KernelNew) or had run earlier cells (KernelKept).
	Kernel string `json:"kernel,omitempty"`
	// StateLost is set when the run's kept interpreter died with it: it
	// ignored an interrupt, crashed or exited.
	StateLost bool `json:"state_lost,omitempty"`
	// Phase says, for a compiled language, which phase ended the run:
	// PhaseCompile (the compiler failed, or was killed) or PhaseRun.
	Phase string `json:"phase,omitempty"`
	// DataSum, from an agent told to (Config.DataSum), is a fingerprint
	// of the programs' folder after the run (datasum.go): the same sum
	// after two runs says nothing in it changed in between.
	DataSum string `json:"data_sum,omitempty"`
	// Quota, from an agent given one (Config.Quota), is the bound the
	// run's files passed, QuotaBytes or QuotaEntries: the agent stopped
	// its program there, and DataSum is empty.
	Quota string `json:"quota,omitempty"`
}

// Values of Exit.Kernel.
const (
	KernelNew  = "new"
	KernelKept = "kept"
)

// Reset reports how a reset went. A sandbox whose agent does not say
// Clean is not given to another conversation.
type Reset struct {
	Clean bool `json:"clean"`
	// Reason says what was found left, when not clean.
	Reason string `json:"reason,omitempty"`
}

// Failure reports a run the agent could not start.
type Failure struct {
	Message string `json:"message"`
}

// frameWriter serialises frames from several goroutines onto one stream.
type frameWriter struct {
	mu sync.Mutex
	w  *bufio.Writer
}

func newFrameWriter(w io.Writer) *frameWriter {
	return &frameWriter{w: bufio.NewWriterSize(w, chunkSize+64)}
}

func (fw *frameWriter) write(typ byte, payload []byte) error {
	if len(payload) > MaxPayload {
		return ErrFrameTooLarge
	}
	var hdr [5]byte
	hdr[0] = typ
	binary.BigEndian.PutUint32(hdr[1:], uint32(len(payload)))
	fw.mu.Lock()
	defer fw.mu.Unlock()
	if _, err := fw.w.Write(hdr[:]); err != nil {
		return err
	}
	if _, err := fw.w.Write(payload); err != nil {
		return err
	}
	return fw.w.Flush()
}

func (fw *frameWriter) writeJSON(typ byte, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return fw.write(typ, b)
}

// readFrame reads one frame. The payload is freshly allocated: callers may
// keep it.
func readFrame(r *bufio.Reader) (byte, []byte, error) {
	var hdr [5]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return 0, nil, err
	}
	n := binary.BigEndian.Uint32(hdr[1:])
	if n > MaxPayload {
		return 0, nil, fmt.Errorf("%w: %d bytes", ErrFrameTooLarge, n)
	}
	payload := make([]byte, n)
	if _, err := io.ReadFull(r, payload); err != nil {
		if errors.Is(err, io.EOF) {
			err = io.ErrUnexpectedEOF
		}
		return 0, nil, err
	}
	return hdr[0], payload, nil
}
