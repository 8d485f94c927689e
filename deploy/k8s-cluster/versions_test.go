package k8scluster

import (
	"os"
	"regexp"
	"testing"
)

// TestGVisorShimMatchesRunsc: the shim the RuntimeClass "runsc" runs
// (runsc-shim/) is built from the gVisor that deploy/runsc.sh builds runsc
// from: the shim drives runsc through its command line, which is not kept
// stable across gVisor's versions.
func TestGVisorShimMatchesRunsc(t *testing.T) {
	script, err := os.ReadFile("../runsc.sh")
	if err != nil {
		t.Fatal(err)
	}
	mod, err := os.ReadFile("runsc-shim/go.mod")
	if err != nil {
		t.Fatal(err)
	}
	runsc := regexp.MustCompile(`(?m)^version=(v\S+)$`).FindSubmatch(script)
	shim := regexp.MustCompile(`(?m)^\s*gvisor\.dev/gvisor (v\S+)$`).FindSubmatch(mod)
	if runsc == nil || shim == nil {
		t.Fatalf("no gVisor version found: runsc.sh %q, runsc-shim/go.mod %q", runsc, shim)
	}
	if string(runsc[1]) != string(shim[1]) {
		t.Errorf("runsc is gVisor %s but its containerd shim is %s: update runsc-shim/go.mod with deploy/runsc.sh", runsc[1], shim[1])
	}
}

// TestKubernetesVersion: the version install.sh stamps into the binaries
// (lib.sh) is the one the wrapper module builds, and every staging module
// is replaced by its release of that version: the kubelet and the API
// server compare versions.
func TestKubernetesVersion(t *testing.T) {
	lib, err := os.ReadFile("lib.sh")
	if err != nil {
		t.Fatal(err)
	}
	mod, err := os.ReadFile("kubernetes/go.mod")
	if err != nil {
		t.Fatal(err)
	}
	stamped := regexp.MustCompile(`(?m)^K8S_VERSION=v1\.(\d+\.\d+)$`).FindSubmatch(lib)
	built := regexp.MustCompile(`(?m)^\s*k8s\.io/kubernetes v1\.(\d+\.\d+)( // indirect)?$`).FindSubmatch(mod)
	if stamped == nil || built == nil {
		t.Fatalf("no Kubernetes version found: lib.sh %q, kubernetes/go.mod %q", stamped, built)
	}
	if string(stamped[1]) != string(built[1]) {
		t.Errorf("lib.sh stamps v1.%s on binaries built from v1.%s", stamped[1], built[1])
	}
	replaces := regexp.MustCompile(`(?m)^\s*(k8s\.io/\S+) => \S+ v0\.(\S+)$`).FindAllSubmatch(mod, -1)
	if len(replaces) < 20 {
		t.Errorf("kubernetes/go.mod replaces %d staging modules; Kubernetes has 31", len(replaces))
	}
	for _, m := range replaces {
		if string(m[2]) != string(built[1]) {
			t.Errorf("%s is replaced by v0.%s, not v0.%s", m[1], m[2], built[1])
		}
	}
}
