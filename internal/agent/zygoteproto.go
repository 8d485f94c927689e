package agent

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"syscall"
	"time"
)

// The zygote's protocol: JSON messages over a SOCK_SEQPACKET socket, the
// descriptors a fork is given passed with them (SCM_RIGHTS).

// zygoteStartTimeout bounds the wait for a fork's pid.
const zygoteStartTimeout = 5 * time.Second

type zygoteFork struct {
	pid  int
	exit chan syscall.WaitStatus
}

type zygoteMessage struct {
	Ready  bool `json:"ready"`
	PID    int  `json:"pid"`
	Ahead  int  `json:"ahead"`
	Seq    int  `json:"seq"` // of the prefork an ahead answers
	Exit   int  `json:"exit"`
	Status int  `json:"status"`
}

// socketPair returns the two ends of a new SOCK_SEQPACKET socket. Ours is
// non-blocking, so that the runtime's poller serves it: a goroutine that
// reads it parks, and the one a message wakes runs on the same thread,
// where a read blocked in the kernel held its thread (and the goroutine it
// woke waited for another: 1 to 2 ms each time under gVisor); and closing
// it ends a read under way. Theirs is blocking, as a child expects.
func socketPair() (ours, theirs *os.File, err error) {
	fds, err := syscall.Socketpair(syscall.AF_UNIX, syscall.SOCK_SEQPACKET|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("socketpair: %w", err)
	}
	if err := syscall.SetNonblock(fds[0], true); err != nil {
		syscall.Close(fds[0])
		syscall.Close(fds[1])
		return nil, nil, fmt.Errorf("socketpair: %w", err)
	}
	return os.NewFile(uintptr(fds[0]), "ours"), os.NewFile(uintptr(fds[1]), "theirs"), nil
}

// sendFiles sends msg on sock, ours of a socketPair, with the descriptors
// of files (blocking ones: a child gets them). sock's own descriptor is
// used through SyscallConn, since File.Fd would make it blocking.
func sendFiles(sock *os.File, msg []byte, files []*os.File) error {
	fds := make([]int, len(files))
	for i, f := range files {
		fds[i] = int(f.Fd())
	}
	rc, err := sock.SyscallConn()
	if err != nil {
		return err
	}
	var sendErr error
	if err := rc.Write(func(fd uintptr) bool {
		sendErr = syscall.Sendmsg(int(fd), msg, syscall.UnixRights(fds...), nil, 0)
		return sendErr != syscall.EAGAIN
	}); err != nil {
		return err
	}
	return sendErr
}

// read handles the zygote's messages until its socket closes. The first
// one means the zygote is no longer dumpable: first is called then.
func (z *zygote) read(sock *os.File, first func()) error {
	buf := make([]byte, 4096)
	for {
		n, err := sock.Read(buf)
		if err != nil {
			return err
		}
		if n == 0 {
			return io.EOF
		}
		first()
		var m zygoteMessage
		if err := json.Unmarshal(buf[:n], &m); err != nil {
			return fmt.Errorf("malformed message: %w", err)
		}
		z.mu.Lock()
		switch {
		case m.Ready:
			if z.template != nil && !z.preloaded {
				// Started or spawned (not done importing: the run that
				// asked for that forks its process anyway). Before it is
				// ready: a run waiting for that finds its process forked.
				z.forkAheadLocked()
			}
			z.setReady(true)
		case m.Ahead > 0:
			for _, a := range z.aheads {
				if a.pid == 0 && a.seq == m.Seq {
					a.pid = m.Ahead
					z.exits[m.Ahead] = a.exit
					close(a.known)
				}
			}
		case m.PID > 0:
			ch := make(chan syscall.WaitStatus, 1)
			z.exits[m.PID] = ch
			select {
			case z.forks <- zygoteFork{pid: m.PID, exit: ch}:
			default:
			}
		case m.Exit > 0:
			if ch, ok := z.exits[m.Exit]; ok {
				ch <- syscall.WaitStatus(m.Status)
				delete(z.exits, m.Exit)
			}
		}
		z.mu.Unlock()
	}
}

// forkRequest is what the zygote forks: a program at Path, a kernel, or
// (from the template) a zygote.
type forkRequest struct {
	Path   string            `json:"path,omitempty"`
	Dir    string            `json:"cwd"`
	Env    []string          `json:"-"`
	EnvMap map[string]string `json:"env"`
	Kernel bool              `json:"kernel,omitempty"`
	Spawn  bool              `json:"spawn,omitempty"`
}

// encode returns the request as the zygote (or a process forked ahead)
// reads it.
func (fr forkRequest) encode() ([]byte, error) {
	fr.EnvMap = make(map[string]string, len(fr.Env))
	for _, kv := range fr.Env {
		if k, v, ok := strings.Cut(kv, "="); ok {
			fr.EnvMap[k] = v
		}
	}
	return json.Marshal(fr)
}

// fork starts a program (or a kernel, or a zygote) from the zygote with
// the given descriptors: stdin, stdout, stderr and, for a kernel, its
// socket; for a zygote, its socket alone.
func (z *zygote) fork(fr forkRequest, files []*os.File) (zygoteFork, error) {
	z.mu.Lock()
	sock, ready := z.sock, z.ready
	z.mu.Unlock()
	if sock == nil || !ready {
		return zygoteFork{}, errZygoteGone
	}
	req, err := fr.encode()
	if err != nil {
		return zygoteFork{}, err
	}
	select {
	case <-z.forks: // a stale answer to a start that timed out
	default:
	}
	if err := sendFiles(sock, req, files); err != nil {
		return zygoteFork{}, fmt.Errorf("send to zygote: %w", err)
	}
	select {
	case f := <-z.forks:
		return f, nil
	case <-time.After(zygoteStartTimeout):
		return zygoteFork{}, errors.New("zygote did not fork")
	}
}
