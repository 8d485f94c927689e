package agent

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

const testPEM = "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"

func TestWithTrust(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "scratch")
	roots := filepath.Join(t.TempDir(), "roots.crt")
	os.WriteFile(roots, []byte("-----BEGIN CERTIFICATE-----\nROOTS\n-----END CERTIFICATE-----"), 0o644)
	env, err := withTrust(dir, Run{Trust: testPEM, Env: map[string]string{"PIP_CERT": "/mine.pem", "X": "y"}}, roots, nil)
	if err != nil {
		t.Fatal(err)
	}
	bundle := filepath.Join(dir, bundleFile)
	for k, want := range map[string]string{"SSL_CERT_FILE": bundle, "REQUESTS_CA_BUNDLE": bundle, "CURL_CA_BUNDLE": bundle,
		"GIT_SSL_CAINFO": bundle, "NODE_EXTRA_CA_CERTS": filepath.Join(dir, trustFile), "PIP_CERT": "/mine.pem", "X": "y"} {
		if env[k] != want {
			t.Errorf("%s=%q, want %q", k, env[k], want)
		}
	}
	b, _ := os.ReadFile(bundle)
	if string(b) != "-----BEGIN CERTIFICATE-----\nROOTS\n-----END CERTIFICATE-----\n"+testPEM {
		t.Errorf("bundle %q", b)
	}
	if b, _ := os.ReadFile(filepath.Join(dir, trustFile)); string(b) != testPEM {
		t.Errorf("certificate %q", b)
	}
	// An image without roots: the bundle is the certificate.
	if _, err := withTrust(dir, Run{Trust: testPEM}, filepath.Join(dir, "none"), nil); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(bundle); string(b) != testPEM {
		t.Errorf("bundle without roots %q", b)
	}
	if _, err := withTrust(dir, Run{Trust: "not a certificate"}, roots, nil); err == nil {
		t.Error("a Trust that is no PEM was written")
	}
}

func TestServeTrust(t *testing.T) {
	c := startAgent(t)
	// A program that replaced the files (or a link in their place) does
	// not stop the next run's from being written.
	send(t, c, Run{Code: `d=$(dirname "$0"); rm -f "$d/ca-certificates.crt"; ln -s /etc/passwd "$d/ca-certificates.crt"; echo ok`}, "")
	if o := collect(t, c); o.stdout != "ok\n" {
		t.Fatalf("%+v", o)
	}
	send(t, c, Run{Code: `cat "$NODE_EXTRA_CA_CERTS"; test -f "$SSL_CERT_FILE" && ! test -L "$SSL_CERT_FILE" && echo bundle`, Trust: testPEM}, "")
	o := collect(t, c)
	if o.failed != "" || o.stdout != testPEM+"bundle\n" {
		t.Errorf("%+v", o)
	}
	// A run without Trust finds none of it.
	send(t, c, Run{Code: `echo "[$SSL_CERT_FILE]"`}, "")
	if o := collect(t, c); strings.TrimSpace(o.stdout) != "[]" {
		t.Errorf("%+v", o)
	}
}
