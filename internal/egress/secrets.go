package egress

import (
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"

	"github.com/goccy/go-yaml"
	"golang.org/x/net/http/httpguts"
)

// Secrets are values a run may use without its program seeing them
// (SANDBOX_SECRETS_FILE). A run asks for them by name; its program finds
// in its environment, under the name upper-cased, a placeholder
// (Secret.Placeholder); the proxy sets the secret's header on every
// request the program makes to the secret's domains over HTTPS, which it
// decrypts for that (mitm.go), and replaces the placeholder by the value
// wherever the program put it in a header of such a request. Nothing else
// carries the value: not a request to any other name (it keeps the
// placeholder), not a URL or a body, not plain HTTP, and not the answers
// the program gets back, from which every form of the value is replaced
// by the placeholder (scrub.go).

// Secret is one of the operator's secrets.
type Secret struct {
	Name  string
	Value string
	// Domains are the names whose requests carry it.
	Domains Patterns
	// Header is the header set (canonical form), Format its value, where
	// {value} stands for Value.
	Header string
	Format string
}

// Secrets are the operator's secrets, by name.
type Secrets map[string]Secret

// Bounds of a secret.
const (
	// MinSecretBytes bounds how short a value may be: the proxy replaces
	// its every occurrence in what servers answer, and a short one would
	// match text that is no secret.
	MinSecretBytes = 8
	maxSecretBytes = 8 << 10
	// MaxRunSecrets bounds the secrets one run may ask for.
	MaxRunSecrets = 16
)

// valueMark is what a format holds where the value goes.
const valueMark = "{value}"

var secretName = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9_]{0,63}$`)

// ValidSecretName reports whether s may name a secret.
func ValidSecretName(s string) bool { return secretName.MatchString(s) }

// EnvName is the environment variable that holds the secret's
// placeholder in a program's environment: its name upper-cased.
func (s Secret) EnvName() string { return strings.ToUpper(s.Name) }

// Placeholder is what the program holds in place of the value. It is no
// secret: it is replaced only in requests of a run that asked for the
// secret, to the secret's domains.
func (s Secret) Placeholder() string { return Placeholder(s.Name) }

// Placeholder is the placeholder of the secret name.
func Placeholder(name string) string { return "runbox-secret-" + name + "-placeholder" }

// headerValue is what the secret's header is set to.
func (s Secret) headerValue() string { return strings.ReplaceAll(s.Format, valueMark, s.Value) }

// For reports whether requests to host carry the secret.
func (s Secret) For(host string) bool { return s.Domains.Match(host) }

// reservedEnv are the variables the sandbox sets, which no secret's may
// replace (besides RUNBOX_*).
var reservedEnv = []string{"PATH", "HOME", "USER", "SHELL", "PWD", "LANG", "TMPDIR",
	"HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "ALL_PROXY", "NPM_CONFIG_PROXY", "NPM_CONFIG_HTTPS_PROXY",
	"PIP_INDEX_URL", "PIP_TRUSTED_HOST", "NPM_CONFIG_REGISTRY", "PYTHONPATH", "PYTHONUSERBASE", "NODE_PATH",
	"SSL_CERT_FILE", "SSL_CERT_DIR", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "NODE_EXTRA_CA_CERTS", "PIP_CERT",
	"GIT_SSL_CAINFO", "LD_PRELOAD", "LD_LIBRARY_PATH", "LD_AUDIT"}

// fixedHeaders are headers no secret may set: they frame the request or
// the connection, or name its target.
var fixedHeaders = []string{"Host", "Content-Length", "Transfer-Encoding", "Connection", "Keep-Alive",
	"Proxy-Connection", "Proxy-Authorization", "Proxy-Authenticate", "Te", "Trailer", "Upgrade", "Expect",
	"Accept-Encoding"}

// secretsFile is SANDBOX_SECRETS_FILE.
type secretsFile struct {
	Secrets map[string]struct {
		Value     string   `yaml:"value"`
		ValueFile string   `yaml:"value_file"`
		Domains   []string `yaml:"domains"`
		Header    string   `yaml:"header"`
		Format    string   `yaml:"format"`
	} `yaml:"secrets"`
}

// LoadSecrets reads SANDBOX_SECRETS_FILE; a value_file is read relative
// to the file's folder. Errors name the secret and the field, never a
// value.
func LoadSecrets(path string) (Secrets, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var f secretsFile
	if err := yaml.UnmarshalWithOptions(b, &f, yaml.Strict(), yaml.DisallowUnknownField()); err != nil {
		// The parser quotes the line it stopped at, which may hold a value.
		return nil, fmt.Errorf("not the YAML of secrets: {<name>: {value | value_file, domains, header, format}}")
	}
	out := Secrets{}
	envs := map[string]string{}
	for name, e := range f.Secrets {
		fail := func(format string, args ...any) error {
			return fmt.Errorf("secret %s: %s", name, fmt.Sprintf(format, args...))
		}
		if !ValidSecretName(name) {
			return nil, fmt.Errorf("secret name %q must be a letter then up to 63 letters, digits or '_'", truncate(name))
		}
		s := Secret{Name: name, Value: e.Value, Header: e.Header, Format: e.Format}
		env := s.EnvName()
		switch {
		case envs[env] != "":
			return nil, fail("its variable %s is also secret %s's", env, envs[env])
		case slices.Contains(reservedEnv, env) || strings.HasPrefix(env, "RUNBOX_"):
			return nil, fail("its variable %s is one the sandbox sets", env)
		case (e.Value == "") == (e.ValueFile == ""):
			return nil, fail("needs exactly one of value and value_file")
		case e.ValueFile != "":
			file := e.ValueFile
			if !filepath.IsAbs(file) {
				file = filepath.Join(filepath.Dir(path), file)
			}
			v, err := os.ReadFile(file)
			if err != nil {
				return nil, fail("value_file: %v", err)
			}
			s.Value = strings.TrimRight(string(v), "\r\n")
		}
		envs[env] = name
		if s.Domains, err = ParsePatterns(e.Domains); err != nil {
			return nil, fail("domains: %v", err)
		}
		if len(s.Domains) == 0 {
			return nil, fail("domains names none: the secret would go nowhere")
		}
		if s.Header == "" {
			s.Header = "Authorization"
		}
		s.Header = http.CanonicalHeaderKey(s.Header)
		if s.Format == "" {
			s.Format = valueMark
			if s.Header == "Authorization" {
				s.Format = "Bearer " + valueMark
			}
		}
		switch {
		case !httpguts.ValidHeaderFieldName(s.Header):
			return nil, fail("header %q is not a header name", truncate(s.Header))
		case slices.Contains(fixedHeaders, s.Header):
			return nil, fail("header %s frames the request; a secret may not set it", s.Header)
		case !strings.Contains(s.Format, valueMark):
			return nil, fail("format must hold {value}")
		case len(s.Value) < MinSecretBytes || len(s.Value) > maxSecretBytes:
			return nil, fail("the value must be %d to %d bytes", MinSecretBytes, maxSecretBytes)
		case !validHeaderText(s.Value) || strings.TrimSpace(s.Value) != s.Value:
			return nil, fail("the value holds a control character or surrounding spaces, which no header may carry")
		case !validHeaderText(s.Format):
			return nil, fail("format holds a control character")
		case strings.Contains(s.Placeholder(), s.Value) || strings.Contains(s.Value, "runbox-secret-"):
			return nil, fail("the value and the placeholder must not hold each other")
		}
		out[name] = s
	}
	return out, nil
}

// validHeaderText reports whether s may be (part of) a header's value:
// no control character but the tab.
func validHeaderText(s string) bool {
	return httpguts.ValidHeaderFieldValue(s) && !strings.ContainsAny(s, "\r\n\x00")
}

// Names returns the secrets' names, sorted.
func (ss Secrets) Names() []string {
	names := make([]string, 0, len(ss))
	for n := range ss {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

// Domains returns every domain any of the secrets goes to.
func (ss Secrets) Domains() Patterns {
	var out Patterns
	for _, n := range ss.Names() {
		for _, p := range ss[n].Domains {
			if !slices.Contains(out, p) {
				out = append(out, p)
			}
		}
	}
	return out
}

// Values returns the secrets' values (for redaction).
func (ss Secrets) Values() []string {
	out := make([]string, 0, len(ss))
	for _, n := range ss.Names() {
		out = append(out, ss[n].Value)
	}
	return out
}

// WithoutValues returns the secrets without their values: what the api
// needs to admit runs.
func (ss Secrets) WithoutValues() Secrets {
	out := make(Secrets, len(ss))
	for n, s := range ss {
		s.Value = ""
		out[n] = s
	}
	return out
}

// Pick returns the secrets names asks for, in its order.
func (ss Secrets) Pick(names []string) ([]Secret, error) {
	out := make([]Secret, 0, len(names))
	for _, n := range names {
		s, ok := ss[n]
		if !ok {
			return nil, fmt.Errorf("secret %q is not configured here", truncate(n))
		}
		out = append(out, s)
	}
	return out, nil
}

// matching returns the secrets among ss whose domains name host.
func matching(ss []Secret, host string) []Secret {
	var out []Secret
	for _, s := range ss {
		if s.For(host) {
			out = append(out, s)
		}
	}
	return out
}

// names returns the secrets' names.
func names(ss []Secret) []string {
	out := make([]string, len(ss))
	for i, s := range ss {
		out[i] = s.Name
	}
	return out
}

// applySecrets puts ss, the secrets of a request's host, into its
// header: the placeholder wherever it is becomes the value, then each
// secret's header is set (a later secret's replaces an earlier one's of
// the same name).
func applySecrets(h http.Header, ss []Secret) {
	for name, values := range h {
		for i, v := range values {
			for _, s := range ss {
				v = strings.ReplaceAll(v, s.Placeholder(), s.Value)
			}
			h[name][i] = v
		}
	}
	for _, s := range ss {
		h.Set(s.Header, s.headerValue())
	}
}
