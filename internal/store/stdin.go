package store

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/redis/go-redis/v9"
)

// Input for interactive runs waits in a list per run, in order: each entry
// is "d" and data, or "e" for end of input. The api appends; the executor
// running the program reads.

// maxStdinEntries bounds the input queued for a program that does not read.
const maxStdinEntries = 10000

// ErrInputFull reports a run whose queued input is not being read.
var ErrInputFull = errors.New("the program's input queue is full")

// SendStdin queues input for a run; eof closes the program's stdin after
// it.
func (s *Store) SendStdin(ctx context.Context, id string, data []byte, eof bool) error {
	n, err := s.rdb.LLen(ctx, stdinKey(id)).Result()
	if err != nil {
		return fmt.Errorf("send input: %w", err)
	}
	if n >= maxStdinEntries {
		return ErrInputFull
	}
	pipe := s.rdb.TxPipeline()
	if len(data) > 0 {
		pipe.RPush(ctx, stdinKey(id), append([]byte("d"), data...))
	}
	if eof {
		pipe.RPush(ctx, stdinKey(id), "e")
	}
	pipe.Expire(ctx, stdinKey(id), s.retention)
	if _, err := pipe.Exec(ctx); err != nil {
		return fmt.Errorf("send input: %w", err)
	}
	return nil
}

// Stdin returns a reader of a run's queued input. Read blocks until input
// comes, the input ends (io.EOF), or ctx ends (io.EOF too: the program is
// gone).
func (s *Store) Stdin(ctx context.Context, id string) io.Reader {
	return &stdinReader{ctx: ctx, rdb: s.rdb, key: stdinKey(id)}
}

type stdinReader struct {
	ctx  context.Context
	rdb  redis.UniversalClient
	key  string
	buf  []byte
	done bool
}

func (r *stdinReader) Read(p []byte) (int, error) {
	for len(r.buf) == 0 {
		if r.done || r.ctx.Err() != nil {
			return 0, io.EOF
		}
		res, err := r.rdb.BLPop(r.ctx, time.Second, r.key).Result()
		switch {
		case errors.Is(err, redis.Nil):
			continue
		case err != nil:
			if r.ctx.Err() != nil {
				return 0, io.EOF
			}
			// Redis is away for a moment; keep the program waiting.
			select {
			case <-r.ctx.Done():
			case <-time.After(200 * time.Millisecond):
			}
			continue
		}
		entry := res[1]
		if entry == "e" {
			r.done = true
			continue
		}
		r.buf = []byte(entry[1:])
	}
	n := copy(p, r.buf)
	r.buf = r.buf[n:]
	return n, nil
}
