package lifecycle

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/jonboulle/clockwork"
)

type ticker struct {
	Base
	clock clockwork.Clock
	n     atomic.Int64
}

func (t *ticker) Start(ctx context.Context) error {
	return t.Run(ctx, Every(t.clock, time.Second, func(context.Context) { t.n.Add(1) }))
}

func TestEveryOnTheClock(t *testing.T) {
	clock := clockwork.NewFakeClock()
	tk := &ticker{clock: clock}
	if err := tk.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	defer tk.Stop()
	for i := 1; i <= 3; i++ {
		if err := clock.BlockUntilContext(context.Background(), 1); err != nil {
			t.Fatal(err)
		}
		clock.Advance(time.Second)
		deadline := time.Now().Add(5 * time.Second)
		for tk.n.Load() < int64(i) && time.Now().Before(deadline) {
			time.Sleep(time.Millisecond)
		}
		if got := tk.n.Load(); got != int64(i) {
			t.Fatalf("after %d ticks, ran %d times", i, got)
		}
	}
}

func TestStartStop(t *testing.T) {
	tk := &ticker{clock: clockwork.NewFakeClock()}
	tk.Stop() // never started: nothing to do
	if err := tk.Start(context.Background()); err != nil {
		t.Fatal(err)
	}
	if err := tk.Start(context.Background()); !errors.Is(err, ErrStarted) {
		t.Fatalf("second Start: %v, want ErrStarted", err)
	}
	tk.Stop()
	tk.Stop()
	if err := tk.Start(context.Background()); err != nil {
		t.Fatalf("Start after Stop: %v", err)
	}
	tk.Stop()
}

func TestContextEndsTheLoop(t *testing.T) {
	var b Base
	ctx, cancel := context.WithCancel(context.Background())
	ended := make(chan struct{})
	if err := b.Run(ctx, func(ctx context.Context) { <-ctx.Done(); close(ended) }); err != nil {
		t.Fatal(err)
	}
	cancel()
	select {
	case <-ended:
	case <-time.After(5 * time.Second):
		t.Fatal("the loop did not end with its context")
	}
	b.Stop()
}

type recorder struct {
	name string
	log  *[]string
	fail bool
}

func (r recorder) Start(context.Context) error {
	if r.fail {
		return errors.New("failed")
	}
	*r.log = append(*r.log, "start "+r.name)
	return nil
}
func (r recorder) Stop() { *r.log = append(*r.log, "stop "+r.name) }

func TestGroupOrder(t *testing.T) {
	tests := []struct {
		name    string
		failAt  int // -1: none
		want    []string
		wantErr bool
	}{
		{"all start, stop in reverse", -1, []string{"start a", "start b", "start c", "stop c", "stop b", "stop a"}, false},
		{"a failure stops those started", 2, []string{"start a", "start b", "stop b", "stop a"}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var log []string
			g := Group{}
			for i, n := range []string{"a", "b", "c"} {
				g = append(g, recorder{name: n, log: &log, fail: i == tt.failAt})
			}
			err := g.Start(context.Background())
			if (err != nil) != tt.wantErr {
				t.Fatalf("Start: %v", err)
			}
			if err == nil {
				g.Stop()
			}
			if len(log) != len(tt.want) {
				t.Fatalf("log %v, want %v", log, tt.want)
			}
			for i := range log {
				if log[i] != tt.want[i] {
					t.Fatalf("log %v, want %v", log, tt.want)
				}
			}
		})
	}
}
