package testenv

import (
	"context"
	"testing"

	"github.com/moby/moby/client"
)

// Docker returns a client of the local Docker Engine. A machine without a
// reachable engine fails the test: integration tests must not skip in CI.
func Docker(t testing.TB) *client.Client {
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
