package agent

import (
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"syscall"
)

// A run may bring a certificate its program's TLS clients are to trust
// (Run.Trust): the egress proxy's CA, for a run whose requests to its
// secrets' domains the proxy decrypts. The image's root filesystem is
// read-only, its roots fixed at build: the agent writes the certificate,
// and a bundle of it and the image's roots, into the scratch folder and
// points the variables TLS clients read at them — OpenSSL's (Python's ssl
// and urllib, httpx, Ruby, PHP, Go), requests', curl's, pip's, git's, and
// Node's for the certificate alone (it adds it to its own roots). The
// program may change or remove these files: that only changes what its
// own clients trust. A variable the run sets itself is left as it is.

// SystemRoots is where Debian's images keep their roots (ca-certificates).
const SystemRoots = "/etc/ssl/certs/ca-certificates.crt"

// The files of a run's Trust, in the scratch folder.
const (
	trustFile  = "runbox-ca.pem"
	bundleFile = "ca-certificates.crt"
)

// BundleVars name the bundle of the image's roots and Run.Trust;
// TrustVars the certificate alone.
var (
	BundleVars = []string{"SSL_CERT_FILE", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "PIP_CERT", "GIT_SSL_CAINFO"}
	TrustVars  = []string{"NODE_EXTRA_CA_CERTS"}
)

// maxTrust bounds a run's Trust.
const maxTrust = 64 << 10

// withTrust writes run's Trust into dir (owned by owner, if set) and
// returns the run's environment with the variables that name it.
func withTrust(dir string, run Run, roots string, owner *syscall.Credential) (map[string]string, error) {
	if len(run.Trust) > maxTrust || !strings.Contains(run.Trust, "-----BEGIN CERTIFICATE-----") {
		return nil, errors.New("trust is not a PEM certificate")
	}
	ca := strings.TrimRight(run.Trust, "\n") + "\n"
	system, err := os.ReadFile(roots)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("read the image's roots: %w", err)
	}
	bundle := string(system)
	if bundle != "" && !strings.HasSuffix(bundle, "\n") {
		bundle += "\n"
	}
	if err := writeProgram(dir, trustFile, ca, owner); err != nil {
		return nil, err
	}
	if err := writeProgram(dir, bundleFile, bundle+ca, owner); err != nil {
		return nil, err
	}
	env := maps.Clone(run.Env)
	if env == nil {
		env = map[string]string{}
	}
	set := func(vars []string, path string) {
		for _, k := range vars {
			if _, ok := env[k]; !ok {
				env[k] = path
			}
		}
	}
	set(BundleVars, filepath.Join(dir, bundleFile))
	set(TrustVars, filepath.Join(dir, trustFile))
	return env, nil
}
