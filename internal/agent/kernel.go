package agent

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"syscall"
	"time"
)

// A kernel is a kept interpreter: a process forked from the zygote that
// runs cell after cell of one conversation in one namespace, so that
// variables, imports and loaded data persist between runs (see
// serve_kernel in runners/python/zygote.py). It is the programs' own
// process, as untrusted as they are: what it says only decides its own
// cell's outcome, and a kernel that misbehaves is killed, its state lost.
//
// The agent sends a cell as {"seq", "path", "env"} with the cell's stdin,
// stdout and stderr; the kernel answers {"seq", "done": exit code} once the
// cell is over and its stdio are back on /dev/null. Between cells nothing
// of the conversation runs but the kernel itself (and its threads).

const (
	// interruptGrace is how long a cell may take to end after SIGINT
	// before its kernel is killed.
	interruptGrace = 2 * time.Second
	// interruptRepeat is how often SIGINT is sent again meanwhile.
	interruptRepeat = 100 * time.Millisecond
	// kernelStartTimeout bounds the wait for a new kernel's first word.
	kernelStartTimeout = 10 * time.Second
	// kernelMaxMessage bounds one message from a kernel: a snapshot's
	// answer names up to 64 variables.
	kernelMaxMessage = 16 << 10
)

type kernel struct {
	pid  int
	sock *os.File // our end
	exit chan syscall.WaitStatus
	seq  int
	msgs chan kernelMessage // done messages, by the reader
	gone chan struct{}      // closed when the socket ends or misbehaves
}

type kernelMessage struct {
	Ready bool `json:"ready"`
	Seq   int  `json:"seq"`
	Done  *int `json:"done"`
	// A snapshot's answer (state.go): how many variables were saved or
	// restored, those that could not be (a few by name), and why none
	// could.
	Saved     *int     `json:"saved"`
	Restored  *int     `json:"restored"`
	Lost      []string `json:"lost"`
	LostCount int      `json:"lost_count"`
	Heavy     bool     `json:"heavy"`
	Error     string   `json:"error"`
}

// errNoKernel reports that kept state cannot be had: no zygote is ready.
var errNoKernel = errors.New("kept state is not available in this sandbox (no interpreter to fork from)")

// startKernel forks a kernel from the zygote and waits for its first word.
func startKernel(z *zygote, dir string, env []string) (*kernel, error) {
	if z == nil || !z.waitReady(kernelZygoteWait) {
		return nil, errNoKernel
	}
	ours, theirs, err := socketPair()
	if err != nil {
		return nil, err
	}
	defer theirs.Close()
	null, err := os.OpenFile(os.DevNull, os.O_RDWR, 0)
	if err != nil {
		ours.Close()
		return nil, err
	}
	defer null.Close()
	f, err := z.fork(forkRequest{Dir: dir, Env: env, Kernel: true}, []*os.File{null, null, null, theirs})
	if err != nil {
		ours.Close()
		return nil, err
	}
	k := &kernel{pid: f.pid, sock: ours, exit: f.exit, msgs: make(chan kernelMessage, 4), gone: make(chan struct{})}
	ready := make(chan struct{})
	go k.read(ready)
	select {
	case <-ready:
		return k, nil
	case <-k.gone:
	case <-f.exit:
	case <-time.After(kernelStartTimeout):
	}
	k.kill()
	return nil, errors.New("the kept interpreter did not start")
}

// read forwards the kernel's messages until its socket ends. A message
// that is not the protocol's ends it too: the kernel is then killed.
func (k *kernel) read(ready chan<- struct{}) {
	defer close(k.gone)
	buf := make([]byte, kernelMaxMessage)
	first := true
	for {
		n, err := k.sock.Read(buf)
		if err != nil || n == 0 {
			return
		}
		var m kernelMessage
		if err := json.Unmarshal(buf[:n], &m); err != nil {
			return
		}
		switch {
		case m.Ready && first:
			first = false
			close(ready)
		case m.Done != nil || m.Saved != nil || m.Restored != nil:
			select {
			case k.msgs <- m:
			default: // nobody waits for it: stale, or the kernel's own noise
			}
		}
	}
}

// alive reports whether the kernel can take a cell.
func (k *kernel) alive() bool {
	select {
	case <-k.gone:
		return false
	default:
	}
	return alive(k.pid)
}

// cell is a cell running in a kernel.
type cell struct {
	k   *kernel
	seq int
}

// run sends a cell to the kernel with its stdio.
func (k *kernel) run(path string, env map[string]string, stdio [3]*os.File) (*cell, error) {
	k.seq++
	req, err := json.Marshal(map[string]any{"seq": k.seq, "path": path, "env": env})
	if err != nil {
		return nil, err
	}
	// A done message left over from an earlier cell means nothing now.
	for len(k.msgs) > 0 {
		<-k.msgs
	}
	if err := sendFiles(k.sock, req, stdio[:]); err != nil {
		return nil, fmt.Errorf("send to the kept interpreter: %w", err)
	}
	return &cell{k: k, seq: k.seq}, nil
}

// wait returns the cell's exit status, and whether the kernel is gone with
// it (killed, crashed or out of protocol).
func (c *cell) wait() (ws syscall.WaitStatus, lost bool) {
	for {
		select {
		case m := <-c.k.msgs:
			if m.Seq == c.seq && m.Done != nil {
				return syscall.WaitStatus((*m.Done & 0xff) << 8), false
			}
		case ws := <-c.k.exit:
			c.k.kill()
			return ws, true
		case <-c.k.gone:
			c.k.kill()
			return syscall.WaitStatus(syscall.SIGKILL), true
		}
	}
}

// interrupt asks the cell to stop (KeyboardInterrupt) and kills the kernel
// if it has not within interruptGrace; done is closed when the cell ends.
func (k *kernel) interrupt(done <-chan struct{}) {
	_ = syscall.Kill(k.pid, syscall.SIGINT)
	go func() {
		// Again until the cell is over: between cells the kernel ignores
		// SIGINT, so one that comes before the cell has set its handler
		// is lost (the kernel ignores the late ones after a cell, too).
		tick := time.NewTicker(interruptRepeat)
		defer tick.Stop()
		grace := time.NewTimer(interruptGrace)
		defer grace.Stop()
		for {
			select {
			case <-done:
				return
			case <-tick.C:
				_ = syscall.Kill(k.pid, syscall.SIGINT)
			case <-grace.C:
				k.kill()
				return
			}
		}
	}()
}

// kill ends the kernel, its state with it.
func (k *kernel) kill() {
	_ = syscall.Kill(k.pid, syscall.SIGKILL)
	_ = k.sock.Close()
}
