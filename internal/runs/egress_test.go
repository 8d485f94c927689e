package runs

import (
	"context"
	"log/slog"
	"slices"
	"strings"
	"testing"

	"github.com/runbox-dev/runbox"
	"github.com/runbox-dev/runbox/internal/auth"
	"github.com/runbox-dev/runbox/internal/clients"
	"github.com/runbox-dev/runbox/internal/egress"
)

func TestAdmitEgress(t *testing.T) {
	global, _ := egress.ParseList("pypi.org,*.pythonhosted.org")
	s := NewService(nil, nil, nil, Limits{EgressAllow: global}, slog.New(slog.DiscardHandler))
	tier := func(domains ...string) context.Context {
		return auth.WithClient(context.Background(), clients.Client{Name: "c", Tier: clients.Tier{EgressDomains: domains}})
	}
	none := auth.WithClient(context.Background(), clients.Client{Name: "c", Tier: clients.Tier{EgressDomains: []string{}}})
	net := func(d ...string) *runbox.Network { return &runbox.Network{AllowedDomains: d} }
	tests := []struct {
		name     string
		ctx      context.Context
		spec     runbox.Spec
		wantCode string
		domains  []string // the spec's afterwards
		pkgDoms  []string
	}{
		{"nothing asked", context.Background(), runbox.Spec{Language: "python"}, "", nil, nil},
		{"an empty list asks nothing", context.Background(), runbox.Spec{Language: "python", Network: net()}, "", nil, nil},
		{"within the global list", context.Background(), runbox.Spec{Language: "python", Network: net("PyPI.org", "files.pythonhosted.org")},
			"", []string{"pypi.org", "files.pythonhosted.org"}, nil},
		{"outside the global list", context.Background(), runbox.Spec{Language: "python", Network: net("pypi.org", "evil.com")},
			runbox.EEgressDenied, nil, nil},
		{"a tier's list replaces the global one", tier("files.test"), runbox.Spec{Language: "python", Network: net("files.test")},
			"", []string{"files.test"}, nil},
		{"a tier without the domain", tier("files.test"), runbox.Spec{Language: "python", Network: net("pypi.org")},
			runbox.EEgressDenied, nil, nil},
		{"a tier with no egress", none, runbox.Spec{Language: "python", Network: net("pypi.org")}, runbox.EEgressDenied, nil, nil},
		{"an address", context.Background(), runbox.Spec{Language: "python", Network: net("127.0.0.1")}, runbox.EInvalid, nil, nil},
		{"packages install from the allowlist", context.Background(), runbox.Spec{Language: "python", Packages: []string{"requests==2.32.3"}},
			"", nil, []string{"pypi.org", "*.pythonhosted.org"}},
		{"npm packages", tier("registry.npmjs.org"), runbox.Spec{Language: "typescript", Packages: []string{"@scope/pkg@^1.2.0", "left-pad"}},
			"", nil, []string{"registry.npmjs.org"}},
		{"packages for bash", context.Background(), runbox.Spec{Language: "bash", Packages: []string{"x"}}, runbox.EInvalid, nil, nil},
		{"an option for a package", context.Background(), runbox.Spec{Language: "python", Packages: []string{"--index-url=http://evil"}},
			runbox.EInvalid, nil, nil},
		{"a control character", context.Background(), runbox.Spec{Language: "python", Packages: []string{"a\nb"}}, runbox.EInvalid, nil, nil},
		{"a forged install list is replaced", context.Background(), runbox.Spec{Language: "python", PackageDomains: []string{"*.com"}}, "", nil, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			spec := tt.spec
			err := s.AdmitEgress(tt.ctx, &spec)
			if runbox.ErrorCode(err) != tt.wantCode && !(tt.wantCode == "" && err == nil) {
				t.Fatalf("error %v, want %q", err, tt.wantCode)
			}
			if err != nil {
				if tt.wantCode == runbox.EEgressDenied && len(tt.spec.Domains()) > 0 && !containsAny(runbox.ErrorMessage(err), tt.spec.Domains()) {
					t.Errorf("message %q names no domain", runbox.ErrorMessage(err))
				}
				return
			}
			if !slices.Equal(spec.Domains(), tt.domains) || !slices.Equal(spec.PackageDomains, tt.pkgDoms) {
				t.Errorf("domains %v, install domains %v; want %v, %v", spec.Domains(), spec.PackageDomains, tt.domains, tt.pkgDoms)
			}
		})
	}
}

func containsAny(s string, subs []string) bool {
	return slices.ContainsFunc(subs, func(sub string) bool { return sub != "" && strings.Contains(s, strings.ToLower(sub)) })
}

func TestAdmitSecrets(t *testing.T) {
	secrets := egress.Secrets{"openai": {Name: "openai"}, "github": {Name: "github"}}
	s := NewService(nil, nil, nil, Limits{Secrets: secrets}, slog.New(slog.DiscardHandler))
	tier := func(names ...string) context.Context {
		return auth.WithClient(context.Background(), clients.Client{Name: "c", Tier: clients.Tier{Secrets: names}})
	}
	any := context.Background()
	many := make([]string, egress.MaxRunSecrets+1)
	for i := range many {
		many[i] = "openai"
	}
	tests := []struct {
		name     string
		ctx      context.Context
		spec     runbox.Spec
		wantCode string
		want     []string
	}{
		{"none", any, runbox.Spec{Secrets: []string{}}, "", nil},
		{"a tier that names none may use all", any, runbox.Spec{Secrets: []string{"openai", "github", "openai"}}, "", []string{"openai", "github"}},
		{"within the tier's", tier("github"), runbox.Spec{Secrets: []string{"github"}}, "", []string{"github"}},
		{"outside the tier's", tier("github"), runbox.Spec{Secrets: []string{"openai"}}, runbox.EEgressDenied, nil},
		{"a tier with none", tier([]string{}...), runbox.Spec{Secrets: []string{"github"}}, runbox.EEgressDenied, nil},
		{"an unknown one", any, runbox.Spec{Secrets: []string{"stripe"}}, runbox.EEgressDenied, nil},
		{"names are exact", any, runbox.Spec{Secrets: []string{"OpenAI"}}, runbox.EEgressDenied, nil},
		{"env sets the placeholder's variable", any, runbox.Spec{Secrets: []string{"openai"}, Env: map[string]string{"OPENAI": "sk-real"}},
			runbox.EInvalid, nil},
		{"too many", any, runbox.Spec{Secrets: many}, runbox.EInvalid, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			spec := tt.spec
			err := s.AdmitSecrets(tt.ctx, &spec)
			if runbox.ErrorCode(err) != tt.wantCode && !(tt.wantCode == "" && err == nil) {
				t.Fatalf("error %v, want %q", err, tt.wantCode)
			}
			if err == nil && !slices.Equal(spec.Secrets, tt.want) {
				t.Errorf("secrets %v, want %v", spec.Secrets, tt.want)
			}
			if tt.wantCode == runbox.EEgressDenied && !strings.Contains(runbox.ErrorMessage(err), tt.spec.Secrets[0]) {
				t.Errorf("message %q names no secret", runbox.ErrorMessage(err))
			}
		})
	}
}
