package store

import (
	"context"
	"errors"
	"io"
	"net"

	"github.com/redis/go-redis/v9"
)

// Transient reports whether err says that Redis could not be reached or
// could not take the command for now, so that the same command tried
// again later may succeed: the connection refused, reset or cut (EOF),
// a timeout, no connection free in the pool, or Redis answering that it
// cannot serve yet — LOADING its data after a restart, READONLY or
// MASTERDOWN during a failover, TRYAGAIN, CLUSTERDOWN, NOREPLICAS, BUSY
// running a script, or too many clients. A command's or script's own
// error, a closed client and the end of the caller's context are not:
// trying again would fail again, or was not asked for.
func Transient(err error) bool {
	if err == nil || errors.Is(err, redis.ErrClosed) {
		return false
	}
	// Before the context's errors: a dial or a read that timed out also
	// says it is context.DeadlineExceeded.
	if _, ok := errors.AsType[*net.OpError](err); ok {
		return true
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return false
	}
	if _, ok := errors.AsType[net.Error](err); ok {
		return true
	}
	return errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, redis.ErrPoolTimeout) ||
		redis.IsLoadingError(err) || redis.IsReadOnlyError(err) || redis.IsMasterDownError(err) ||
		redis.IsTryAgainError(err) || redis.IsClusterDownError(err) || redis.IsNoReplicasError(err) ||
		redis.IsMaxClientsError(err) || redis.HasErrorPrefix(err, "BUSY ")
}
