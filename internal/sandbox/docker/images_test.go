package docker

import (
	"crypto/rand"
	"os/exec"
	"strings"
	"testing"
)

// TestImagesUntagged: an untagged image that carries a runner's labels —
// a runner's previous build, or a build under way — is listed without a
// tag (the Docker Engine here names it "<none>:<none>"), so that no
// sandbox is ever created from that placeholder.
func TestImagesUntagged(t *testing.T) {
	label := "runbox-test-untagged=" + strings.ToLower(rand.Text()[:10])
	build := exec.Command("docker", "build", "-q", "-")
	build.Stdin = strings.NewReader("FROM debian:bookworm-slim\nLABEL " + label + "\n")
	out, err := build.Output()
	if err != nil {
		t.Fatalf("docker build: %v", err)
	}
	id := strings.TrimSpace(string(out))
	t.Cleanup(func() { _ = exec.Command("docker", "rmi", "-f", id).Run() })
	tag := "runbox-test-untagged:" + strings.ToLower(rand.Text()[:10])

	e, err := Open(t.Context(), Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer e.Close()
	for _, tt := range []struct {
		name string
		tag  bool
		want []string
	}{
		{name: "untagged", want: []string{}},
		{name: "tagged", tag: true, want: []string{tag}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			if tt.tag {
				if out, err := exec.Command("docker", "tag", id, tag).CombinedOutput(); err != nil {
					t.Fatalf("docker tag: %v: %s", err, out)
				}
				t.Cleanup(func() { _ = exec.Command("docker", "rmi", tag).Run() })
			}
			images, err := e.Images(t.Context(), label)
			if err != nil {
				t.Fatal(err)
			}
			if len(images) != 1 || strings.Join(images[0].Tags, ",") != strings.Join(tt.want, ",") {
				t.Fatalf("images %+v, want one tagged %v", images, tt.want)
			}
		})
	}
}

func TestReferences(t *testing.T) {
	for _, tt := range []struct {
		tags, want []string
	}{
		{nil, []string{}},
		{[]string{"<none>:<none>"}, []string{}},
		{[]string{"runner-python:latest"}, []string{"runner-python:latest"}},
		{[]string{"<none>:<none>", "runner-python:v2"}, []string{"runner-python:v2"}},
	} {
		if got := references(tt.tags); strings.Join(got, ",") != strings.Join(tt.want, ",") || got == nil {
			t.Errorf("references(%q) = %q, want %q", tt.tags, got, tt.want)
		}
	}
}
