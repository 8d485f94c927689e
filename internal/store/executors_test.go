package store

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/runbox-dev/runbox"
)

func TestExecutorRegistry(t *testing.T) {
	backends(t, func(t *testing.T, s *Store) {
		ctx := context.Background()
		py := runbox.Runner{Language: "python", Image: "runner-python"}
		sh := runbox.Runner{Language: "bash", Image: "runner-bash"}
		s.Heartbeat(ctx, runbox.ExecutorInfo{ID: "a", Runners: []runbox.Runner{py}}, time.Minute)
		s.Heartbeat(ctx, runbox.ExecutorInfo{ID: "b", Runners: []runbox.Runner{sh, py}}, time.Minute)
		s.Heartbeat(ctx, runbox.ExecutorInfo{ID: "gone", Runners: []runbox.Runner{{Language: "cobol"}}}, time.Millisecond)
		time.Sleep(20 * time.Millisecond)
		runners, err := s.Runners(ctx)
		if err != nil {
			t.Fatal(err)
		}
		if fmt.Sprint(runners) != fmt.Sprint([]runbox.Runner{sh, py}) {
			t.Errorf("runners = %v", runners)
		}
		s.Unregister(ctx, "b")
		if runners, _ := s.Runners(ctx); len(runners) != 1 {
			t.Errorf("after unregister: %v", runners)
		}
	})
}

func TestDeployment(t *testing.T) {
	backends(t, func(t *testing.T, s *Store) {
		ctx := context.Background()
		first, err := s.Deployment(ctx)
		if err != nil || first == "" {
			t.Fatalf("Deployment = %q, %v", first, err)
		}
		// Every later caller, another executor included, gets the same id.
		if again, err := s.Deployment(ctx); err != nil || again != first {
			t.Errorf("Deployment again = %q, %v; want %q", again, err, first)
		}
	})
}
