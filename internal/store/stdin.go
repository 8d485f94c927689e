package store

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/runbox-dev/runbox"
)

// Input for interactive runs waits in a list per run, in order: each entry
// is "d" and data, or "e" for end of input. The api appends; the executor
// running the program reads.

// maxStdinEntries bounds the entries of the queue, whatever their size.
const maxStdinEntries = 10000

// sendStdinScript queues input within the budget.
//
// KEYS[1] the input list, KEYS[2] its byte count
// ARGV[1] most bytes queued, ARGV[2] most entries, ARGV[3] ttl (ms),
// ARGV[4] data ("" for none), ARGV[5] "1" to end the input after it
// Returns 1, or 0 when the budget would be exceeded.
var sendStdinScript = redis.NewScript(`
if redis.call('LLEN', KEYS[1]) >= tonumber(ARGV[2]) then return 0 end
if ARGV[4] ~= '' then
  local queued = tonumber(redis.call('GET', KEYS[2]) or '0')
  if queued + #ARGV[4] > tonumber(ARGV[1]) then return 0 end
  redis.call('INCRBY', KEYS[2], #ARGV[4])
  redis.call('RPUSH', KEYS[1], 'd' .. ARGV[4])
end
if ARGV[5] == '1' then redis.call('RPUSH', KEYS[1], 'e') end
redis.call('PEXPIRE', KEYS[1], ARGV[3])
redis.call('PEXPIRE', KEYS[2], ARGV[3])
return 1
`)

// SendStdin queues input for a run; eof closes the program's stdin after
// it. It returns ErrInputFull when the run's unread input would pass
// MaxQueuedStdin.
func (s *Runs) SendStdin(ctx context.Context, id string, data []byte, eof bool) error {
	eofArg := ""
	if eof {
		eofArg = "1"
	}
	ok, err := sendStdinScript.Run(ctx, s.rdb, []string{stdinKey(id), stdinBytesKey(id)},
		runbox.MaxQueuedStdin, maxStdinEntries, s.retention.Milliseconds(), data, eofArg).Int()
	if err != nil {
		return fmt.Errorf("send input: %w", err)
	}
	if ok == 0 {
		return runbox.ErrInputFull
	}
	return nil
}

// Stdin returns a reader of a run's queued input. Read blocks until input
// comes, the input ends (io.EOF), or ctx ends (io.EOF too: the program is
// gone).
func (s *Runs) Stdin(ctx context.Context, id string) io.Reader {
	return &stdinReader{ctx: ctx, rdb: s.rdb, key: stdinKey(id), bytesKey: stdinBytesKey(id)}
}

type stdinReader struct {
	ctx      context.Context
	rdb      redis.UniversalClient
	key      string
	bytesKey string
	buf      []byte
	done     bool
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
		// Read, it no longer counts against the budget. Should this fail,
		// the client is refused a little early, never allowed more.
		r.rdb.DecrBy(r.ctx, r.bytesKey, int64(len(r.buf)))
	}
	n := copy(p, r.buf)
	r.buf = r.buf[n:]
	return n, nil
}
