package agent

import (
	"errors"
	"log"
	"os"
	"sync"
	"time"
)

// DefaultLineWait is how long relay waits for the rest of a line:
// unbuffered programs write a line in pieces (Python's print writes the
// text, then the newline), and a client should see the line as one chunk.
const DefaultLineWait = 2 * time.Millisecond

// relay copies a program's output into frames until the pipe closes.
func relay(wg *sync.WaitGroup, r *os.File, typ byte, fw *frameWriter, lineWait time.Duration) {
	defer wg.Done()
	defer r.Close()
	buf := make([]byte, chunkSize)
	for {
		n, err := r.Read(buf)
		// Gather the rest of an unfinished line for a moment.
		for err == nil && n > 0 && n < len(buf) && buf[n-1] != '\n' {
			if r.SetReadDeadline(time.Now().Add(lineWait)) != nil {
				break
			}
			var m int
			m, err = r.Read(buf[n:])
			n += m
			if errors.Is(err, os.ErrDeadlineExceeded) {
				err = nil
				break
			}
		}
		_ = r.SetReadDeadline(time.Time{})
		if n > 0 {
			if fw.write(typ, buf[:n]) != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// pipes makes a program's stdin, stdout and stderr pipes.
func pipes() (stdinR, stdinW, outR, outW, errR, errW *os.File, err error) {
	if stdinR, stdinW, err = os.Pipe(); err != nil {
		return
	}
	if outR, outW, err = os.Pipe(); err != nil {
		closeAll(stdinR, stdinW)
		return
	}
	if errR, errW, err = os.Pipe(); err != nil {
		closeAll(stdinR, stdinW, outR, outW)
	}
	return
}

func closeAll(files ...*os.File) {
	for _, f := range files {
		_ = f.Close()
	}
}

// maxQueuedStdin bounds the input the agent holds for a program that does
// not read it. The executor sends no more than its own budget; past this,
// the rest is dropped and the program's input ends.
const maxQueuedStdin = 8 << 20

// stdinQueue feeds a program's stdin without ever blocking the frame loop:
// a program that does not read its input must not stop the agent from
// hearing a kill.
type stdinQueue struct {
	w      *os.File
	mu     sync.Mutex
	cond   *sync.Cond
	chunks [][]byte
	queued int
	closed bool
}

func newStdinQueue(w *os.File) *stdinQueue {
	q := &stdinQueue{w: w}
	q.cond = sync.NewCond(&q.mu)
	return q
}

func (q *stdinQueue) push(p []byte) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed {
		return
	}
	if q.queued+len(p) > maxQueuedStdin {
		log.Printf("stdin: more than %d bytes the program has not read; its input ends here", maxQueuedStdin)
		q.closed = true
	} else {
		q.chunks = append(q.chunks, p)
		q.queued += len(p)
	}
	q.cond.Signal()
}

// close ends the input once what was queued is written.
func (q *stdinQueue) close() {
	q.mu.Lock()
	defer q.mu.Unlock()
	q.closed = true
	q.cond.Signal()
}

func (q *stdinQueue) run() {
	defer q.w.Close()
	for {
		q.mu.Lock()
		for len(q.chunks) == 0 && !q.closed {
			q.cond.Wait()
		}
		if len(q.chunks) == 0 {
			q.mu.Unlock()
			return
		}
		chunk := q.chunks[0]
		q.chunks = q.chunks[1:]
		q.queued -= len(chunk)
		q.mu.Unlock()
		if _, err := q.w.Write(chunk); err != nil {
			return // the program closed its stdin or exited
		}
	}
}
