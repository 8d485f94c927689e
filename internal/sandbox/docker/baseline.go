package docker

import (
	"context"
	"time"

	"github.com/moby/moby/api/types/container"
	"github.com/moby/moby/client"
)

// StartTimes times creating and starting a bare container of image (it
// sleeps, with no network) n times, removing each: the baseline `make
// bench` sets a sandbox's cold start beside, what a run would wait for if
// every run got a new container.
func (e *Engine) StartTimes(ctx context.Context, image string, n int) ([]time.Duration, error) {
	var out []time.Duration
	for range n {
		t := time.Now()
		created, err := e.c.ContainerCreate(ctx, client.ContainerCreateOptions{
			Config:     &container.Config{Image: image, Entrypoint: []string{"sleep"}, Cmd: []string{"infinity"}, NetworkDisabled: true},
			HostConfig: &container.HostConfig{NetworkMode: "none"},
		})
		if err != nil {
			return nil, err
		}
		_, err = e.c.ContainerStart(ctx, created.ID, client.ContainerStartOptions{})
		d := time.Since(t)
		_, _ = e.c.ContainerRemove(context.WithoutCancel(ctx), created.ID, client.ContainerRemoveOptions{Force: true})
		if err != nil {
			return nil, err
		}
		out = append(out, d)
	}
	return out, nil
}
