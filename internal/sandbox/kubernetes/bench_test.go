package kubernetes

import (
	"context"
	"os/exec"
	"slices"
	"testing"
	"time"

	"github.com/runbox-dev/runbox/internal/agent"
)

// BenchmarkStartToHello measures a sandbox's start: the pod created,
// running, attached, and its agent's hello read. It reports the median
// and the 95th percentile.
func BenchmarkStartToHello(b *testing.B) {
	c := testCluster(b)
	e := c.engine(b)
	var took []time.Duration
	for b.Loop() {
		spec := c.spec(nil)
		t0 := time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
		s, err := e.Start(ctx, spec, nil)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := agent.NewConn(s, s).Hello(); err != nil {
			b.Fatal(err)
		}
		took = append(took, time.Since(t0))
		cancel()
		s.Close()
		_ = e.Remove(spec.Name)
	}
	slices.Sort(took)
	b.ReportMetric(float64(took[len(took)/2].Milliseconds()), "p50-ms")
	b.ReportMetric(float64(took[len(took)*95/100].Milliseconds()), "p95-ms")
}

// BenchmarkWarmPrint measures print(1) in a sandbox that runs already,
// through the API server's attach stream.
func BenchmarkWarmPrint(b *testing.B) {
	c := testCluster(b)
	e := c.engine(b)
	conn, _ := start(b, e, c.spec(nil))
	run(b, conn, "print(1)")
	for b.Loop() {
		if out, _ := run(b, conn, "print(1)"); out != "1\n" {
			b.Fatalf("print(1): %q", out)
		}
	}
}

// BenchmarkWarmPrintDocker is BenchmarkWarmPrint's baseline: the same
// image and agent in a Docker container, attached by the docker CLI.
func BenchmarkWarmPrintDocker(b *testing.B) {
	imageOnce.Do(func() { imageName, imageErr = buildImage() })
	if imageErr != nil {
		b.Fatal(imageErr)
	}
	cmd := exec.Command("docker", "run", "--rm", "-i", "--network=none", "--read-only", "--tmpfs", "/tmp",
		"--cap-drop=ALL", "--security-opt=no-new-privileges", "--label", "runbox.test=kubernetes", imageName)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		b.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		b.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		stdin.Close()
		_ = cmd.Wait()
	})
	conn := agent.NewConn(stdout, stdin)
	if _, err := conn.Hello(); err != nil {
		b.Fatal(err)
	}
	run(b, conn, "print(1)")
	for b.Loop() {
		if out, _ := run(b, conn, "print(1)"); out != "1\n" {
			b.Fatalf("print(1): %q", out)
		}
	}
}
