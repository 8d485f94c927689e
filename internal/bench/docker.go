package bench

import (
	"bufio"
	"context"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/runbox-dev/runbox/internal/sandbox/docker"
)

// The baselines: what the same work costs with Docker alone.

// DockerRun times `docker run --rm` of image n times, `parallel` at once,
// and returns each run's time and the whole.
func DockerRun(ctx context.Context, image string, n, parallel int, args ...string) ([]time.Duration, time.Duration, error) {
	var (
		mu    sync.Mutex
		times []time.Duration
		first error
		wg    sync.WaitGroup
		sem   = make(chan struct{}, max(parallel, 1))
	)
	start := time.Now()
	for range n {
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			t := time.Now()
			out, err := exec.CommandContext(ctx, "docker", append([]string{"run", "--rm", "--network", "none", image}, args...)...).CombinedOutput()
			d := time.Since(t)
			mu.Lock()
			defer mu.Unlock()
			if err != nil && first == nil {
				first = fmt.Errorf("docker run: %w: %s", err, out)
			}
			times = append(times, d)
		})
	}
	wg.Wait()
	return times, time.Since(start), first
}

// Container is a long-running container for docker exec baselines.
type Container struct{ ID string }

// StartContainer starts image with dataDir at /data, idling.
func StartContainer(ctx context.Context, image, dataDir string) (*Container, error) {
	out, err := exec.CommandContext(ctx, "docker", "run", "-d", "--network", "none", "-v", dataDir+":/data",
		"-w", "/data", "--entrypoint", "sleep", image, "infinity").Output()
	if err != nil {
		return nil, fmt.Errorf("docker run -d: %w", err)
	}
	return &Container{ID: strings.TrimSpace(string(out))}, nil
}

// Exec times `docker exec` of args in the container.
func (c *Container) Exec(ctx context.Context, args ...string) (time.Duration, error) {
	t := time.Now()
	out, err := exec.CommandContext(ctx, "docker", append([]string{"exec", c.ID}, args...)...).CombinedOutput()
	if err != nil {
		return 0, fmt.Errorf("docker exec: %w: %s", err, out)
	}
	return time.Since(t), nil
}

// FirstLine measures how long after a program in the container prints the
// time the line reaches this process through `docker exec`.
func (c *Container) FirstLine(ctx context.Context) (time.Duration, error) {
	cmd := exec.CommandContext(ctx, "docker", "exec", c.ID, "python3", "-u", "-c",
		"import time\nprint(repr(time.time()), flush=True)\ntime.sleep(0.2)")
	out, err := cmd.StdoutPipe()
	if err != nil {
		return 0, err
	}
	if err := cmd.Start(); err != nil {
		return 0, err
	}
	defer cmd.Wait()
	line, err := bufio.NewReader(out).ReadString('\n')
	now := time.Now()
	if err != nil {
		return 0, err
	}
	printed, err := strconv.ParseFloat(strings.TrimSpace(line), 64)
	if err != nil {
		return 0, err
	}
	return now.Sub(time.Unix(0, int64(printed*1e9))), nil
}

// Remove removes the container.
func (c *Container) Remove() {
	_ = exec.Command("docker", "rm", "-f", c.ID).Run()
}

// APIStart times creating and starting a container of image through the
// Engine API: what a run waits for before it can start when every run
// gets a new container.
func APIStart(ctx context.Context, image string, n int) ([]time.Duration, error) {
	e, err := docker.Open(ctx, docker.Options{})
	if err != nil {
		return nil, err
	}
	defer e.Close()
	return e.StartTimes(ctx, image, n)
}
