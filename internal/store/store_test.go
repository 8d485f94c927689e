package store

import (
	"testing"

	"github.com/runbox-dev/runbox/internal/testenv"
)

// backends runs a test against miniredis and a real redis-server.
func backends(t *testing.T, f func(t *testing.T, s *Store)) {
	t.Run("miniredis", func(t *testing.T) {
		_, url := testenv.Miniredis(t)
		f(t, New(NewConn(testenv.Client(t, url))))
	})
	t.Run("redis-server", func(t *testing.T) {
		f(t, New(NewConn(testenv.Client(t, testenv.Redis(t)))))
	})
}
