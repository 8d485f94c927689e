// Package dockertest gives tests a client of the local Docker Engine, to
// look at the containers an engine made. It is for tests alone; beside the
// Docker engine, as the one place that may import the Docker API.
package dockertest

import (
	"context"
	"testing"

	"github.com/moby/moby/client"
)

// Client returns a client of the local Docker Engine, closed when the test
// ends. A machine without a reachable engine fails the test: integration
// tests must not skip in CI.
func Client(t testing.TB) *client.Client {
	t.Helper()
	c, err := client.New(client.FromEnv)
	if err != nil {
		t.Fatalf("docker client: %v", err)
	}
	t.Cleanup(func() { c.Close() })
	if _, err := c.Ping(context.Background(), client.PingOptions{NegotiateAPIVersion: true}); err != nil {
		t.Fatalf("the Docker Engine is not reachable: %v", err)
	}
	return c
}
