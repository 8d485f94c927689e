package runs

import (
	"context"
	"slices"
	"strings"
	"unicode"

	"github.com/runbox-dev/runbox"
	"github.com/runbox-dev/runbox/internal/auth"
	"github.com/runbox-dev/runbox/internal/egress"
)

// Bounds of a run's packages.
const (
	maxPackages    = 32
	maxPackageSpec = 200
)

// packageLanguages are the languages whose runs may install packages,
// and with what.
var packageLanguages = map[string]string{"python": "pip", "typescript": "npm"}

// AdmitEgress checks what a run asks to reach (network.allowed_domains)
// against its client's allowlist — its tier's egress_domains, else
// SANDBOX_EGRESS_ALLOW — before anything runs: a domain outside it is the
// error egress_denied, naming it. It checks the run's packages, and sets
// what installing them may reach: the client's allowlist. Every way of
// submitting a run calls it (Submit does).
func (s *Service) AdmitEgress(ctx context.Context, spec *runbox.Spec) error {
	allow := s.Allowlist(ctx)
	asked, err := allow.Admit(spec.Domains())
	if err != nil {
		return err
	}
	spec.Network = nil
	if len(asked) > 0 {
		spec.Network = &runbox.Network{AllowedDomains: asked.Strings()}
	}
	spec.PackageDomains = nil
	if len(spec.Packages) == 0 {
		spec.Packages = nil
		return nil
	}
	if err := checkPackages(spec.Language, spec.Packages); err != nil {
		return err
	}
	spec.PackageDomains = allow.Strings()
	return nil
}

// AdmitSecrets checks the secrets a run asks for (by name) before
// anything runs: each must be one of the operator's (SANDBOX_SECRETS_FILE)
// that the client's tier allows (its secrets, all of them if it names
// none), else the error egress_denied, naming it (an unknown secret and
// one the client may not use are told apart by no one); and the run's env
// may not set the variable that holds a secret's placeholder. A secret's
// domains need not be among the run's network.allowed_domains nor the
// client's allowlist: the operator who gave it its domains and the tier
// allowed its requests there.
func (s *Service) AdmitSecrets(ctx context.Context, spec *runbox.Spec) error {
	if len(spec.Secrets) == 0 {
		spec.Secrets = nil
		return nil
	}
	if len(spec.Secrets) > egress.MaxRunSecrets {
		return runbox.Errorf(runbox.EInvalid, "secrets has %d entries; the limit is %d", len(spec.Secrets), egress.MaxRunSecrets)
	}
	allowed := auth.Tier(ctx).Secrets
	out := make([]string, 0, len(spec.Secrets))
	for _, name := range spec.Secrets {
		sec, ok := s.limits.Secrets[name]
		if !ok || allowed != nil && !slices.Contains(allowed, name) {
			return runbox.Errorf(runbox.EEgressDenied, "secret %q is not among the secrets this client may use", truncate(name, 64))
		}
		if _, set := spec.Env[sec.EnvName()]; set {
			return runbox.Errorf(runbox.EInvalid, "env sets %s, which holds the placeholder of secret %s", sec.EnvName(), name)
		}
		if !slices.Contains(out, name) {
			out = append(out, name)
		}
	}
	spec.Secrets = out
	return nil
}

// Allowlist returns what the caller's runs may ask to reach.
func (s *Service) Allowlist(ctx context.Context) egress.Patterns {
	if domains := auth.Tier(ctx).EgressDomains; domains != nil {
		ps, err := egress.ParsePatterns(domains) // checked when the tiers were read
		if err != nil {
			return nil
		}
		return ps
	}
	return s.limits.EgressAllow
}

func checkPackages(lang string, pkgs []string) error {
	tool, ok := packageLanguages[lang]
	switch {
	case !ok:
		return runbox.Errorf(runbox.EInvalid, "packages are installed for python (pip) and typescript (npm) runs only")
	case len(pkgs) > maxPackages:
		return runbox.Errorf(runbox.EInvalid, "packages has %d entries; the limit is %d", len(pkgs), maxPackages)
	}
	for _, p := range pkgs {
		trimmed := strings.TrimSpace(p)
		switch {
		case trimmed == "" || len(p) > maxPackageSpec:
			return runbox.Errorf(runbox.EInvalid, "each of packages must be 1 to %d characters", maxPackageSpec)
		case strings.HasPrefix(trimmed, "-"):
			// Passed to the installer after "--", but never an option.
			return runbox.Errorf(runbox.EInvalid, "packages names %s packages, not options: %q", tool, truncate(p, 40))
		case strings.ContainsFunc(p, func(r rune) bool { return unicode.IsControl(r) || r > unicode.MaxASCII }):
			return runbox.Errorf(runbox.EInvalid, "package %q holds a control or non-ASCII character", truncate(p, 40))
		}
	}
	return nil
}
