package store

import (
	"context"
	"fmt"
	"net"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/runbox-dev/runbox"
	"github.com/runbox-dev/runbox/internal/testenv"
)

// TestTransient: what a store's command returns when Redis is down,
// restarting or cut off is transient; what a command, a script or the
// caller got wrong is not.
func TestTransient(t *testing.T) {
	ending := runbox.Ending{From: []runbox.Status{runbox.StatusRunning}, Lease: runbox.LeaseDelete,
		Status: runbox.StatusSucceeded, Result: &runbox.Result{}, Conversation: "c"}
	for _, tc := range []struct {
		name string
		err  func(t *testing.T) error
		want bool
	}{
		{"nil", func(*testing.T) error { return nil }, false},
		{"miniredis closed", func(t *testing.T) error {
			mr, url := testenv.Miniredis(t)
			s := New(NewConn(testenv.Client(t, url)))
			mr.Close()
			_, err := s.Finish(context.Background(), "r1", ending)
			return err
		}, true},
		{"refused port", func(t *testing.T) error {
			s := New(NewConn(testenv.Client(t, fmt.Sprintf("redis://127.0.0.1:%d/0", testenv.FreePort(t)))))
			_, err := s.Run(context.Background(), "r1")
			return err
		}, true},
		{"loading its AOF", func(t *testing.T) error {
			mr, url := testenv.Miniredis(t)
			s := New(NewConn(testenv.Client(t, url)))
			mr.SetError("LOADING Redis is loading the dataset in memory")
			_, err := s.Finish(context.Background(), "r1", ending)
			return err
		}, true},
		{"no answer", func(t *testing.T) error {
			return raw(t, func(net.Conn) {}).Ping(context.Background()).Err()
		}, true},
		{"connection cut", func(t *testing.T) error {
			return raw(t, func(c net.Conn) { c.Close() }).Ping(context.Background()).Err()
		}, true},
		{"script error", func(t *testing.T) error {
			_, url := testenv.Miniredis(t)
			return testenv.Client(t, url).Eval(context.Background(), "return redis.error_reply('ERR boom')", nil).Err()
		}, false},
		{"wrong type", func(t *testing.T) error {
			_, url := testenv.Miniredis(t)
			rdb := testenv.Client(t, url)
			rdb.Set(context.Background(), "k", "v", 0)
			return rdb.HGet(context.Background(), "k", "f").Err()
		}, false},
		{"no such run", func(t *testing.T) error {
			_, url := testenv.Miniredis(t)
			_, err := New(NewConn(testenv.Client(t, url))).Finish(context.Background(), "r1", ending)
			return err
		}, false},
		{"client closed", func(t *testing.T) error {
			_, url := testenv.Miniredis(t)
			rdb := testenv.Client(t, url)
			rdb.Close()
			return rdb.Ping(context.Background()).Err()
		}, false},
		{"caller cancelled", func(t *testing.T) error {
			_, url := testenv.Miniredis(t)
			ctx, cancel := context.WithCancel(context.Background())
			cancel()
			_, err := New(NewConn(testenv.Client(t, url))).Run(ctx, "r1")
			return err
		}, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.err(t)
			if got := Transient(err); got != tc.want {
				t.Errorf("Transient(%v) = %v, want %v", err, got, tc.want)
			}
		})
	}
}

// raw is a client of a server that does to each connection what serve
// does and nothing more; it waits 100 ms for an answer, and tries once.
func raw(t *testing.T, serve func(net.Conn)) *redis.Client {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var conns []net.Conn
	t.Cleanup(func() {
		l.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			c.Close()
		}
	})
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			serve(c)
		}
	}()
	rdb := redis.NewClient(&redis.Options{Addr: l.Addr().String(), ReadTimeout: 100 * time.Millisecond,
		MaxRetries: -1, Protocol: 2, DisableIdentity: true})
	t.Cleanup(func() { rdb.Close() })
	return rdb
}
