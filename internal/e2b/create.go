package e2b

import (
	"context"
	"net/netip"
	"slices"
	"strings"
	"time"

	"github.com/runbox-dev/runbox"
	"github.com/runbox-dev/runbox/internal/egress"
)

// newSandboxJSON is E2B's NewSandbox, and runbox's secrets besides.
type newSandboxJSON struct {
	TemplateID          string            `json:"templateID"`
	Timeout             *int              `json:"timeout"`
	AutoPause           bool              `json:"autoPause"`
	AutoPauseMemory     *bool             `json:"autoPauseMemory"`
	AutoResume          *autoResumeJSON   `json:"autoResume"`
	Secure              *bool             `json:"secure"`
	AllowInternetAccess *bool             `json:"allow_internet_access"`
	Network             *networkJSON      `json:"network"`
	Metadata            map[string]string `json:"metadata"`
	EnvVars             map[string]string `json:"envVars"`
	Mcp                 any               `json:"mcp"`
	VolumeMounts        []any             `json:"volumeMounts"`
	// Secrets names the operator's secrets the sandbox's requests to their
	// domains carry (runbox's, not E2B's: see runs' secrets).
	Secrets []string `json:"secrets"`
}

type autoResumeJSON struct {
	Enabled bool `json:"enabled"`
}

// networkJSON is E2B's SandboxNetworkConfig.
type networkJSON struct {
	AllowPublicTraffic *bool          `json:"allowPublicTraffic"`
	AllowOut           []string       `json:"allowOut"`
	DenyOut            []string       `json:"denyOut"`
	MaskRequestHost    string         `json:"maskRequestHost"`
	Rules              map[string]any `json:"rules"`
}

// Bounds of a sandbox's metadata, as E2B's.
const (
	maxMetadata      = 64
	maxMetadataBytes = 1024
)

// defaultTimeout is a sandbox's life when a create names none (E2B's).
const defaultTimeout = 15 * time.Second

// createRequest checks a create's body, within the caller's rights.
func (s *Service) createRequest(ctx context.Context, body newSandboxJSON) (createRequest, error) {
	tpl, ok := templateOf(body.TemplateID)
	if !ok {
		return createRequest{}, templateError(body.TemplateID)
	}
	timeout := defaultTimeout
	if body.Timeout != nil {
		timeout = time.Duration(*body.Timeout) * time.Second
	}
	switch {
	case timeout < 0 || timeout > s.limits.MaxTimeout:
		return createRequest{}, runbox.Errorf(runbox.EInvalid, "timeout must be between 0 and %d seconds", int(s.limits.MaxTimeout/time.Second))
	case body.Mcp != nil:
		return createRequest{}, runbox.Errorf(runbox.EUnsupported, "mcp (E2B's MCP gateway) is not offered; runbox is an MCP server itself, at /mcp")
	case len(body.VolumeMounts) > 0:
		return createRequest{}, runbox.Errorf(runbox.EUnsupported, "volumes are not offered; a sandbox's files are its conversation's")
	case body.AutoResume != nil && body.AutoResume.Enabled && body.AutoPauseMemory != nil && !*body.AutoPauseMemory:
		return createRequest{}, runbox.Errorf(runbox.EInvalid, "autoResume cannot be combined with autoPauseMemory false")
	}
	if err := checkMetadata(body.Metadata); err != nil {
		return createRequest{}, err
	}
	network, private, err := s.network(ctx, body)
	if err != nil {
		return createRequest{}, err
	}
	return createRequest{template: tpl, id: templateName(body.TemplateID), timeout: timeout, sandbox: runbox.E2BSandbox{
		Metadata: body.Metadata, EnvVars: body.EnvVars, Network: network, Secrets: body.Secrets,
		AllowInternet: body.AllowInternetAccess, AutoPause: body.AutoPause,
		AutoResume: body.AutoResume != nil && body.AutoResume.Enabled, PrivateTraffic: private,
	}}, nil
}

func templateName(id string) string {
	if id == "" {
		return "base"
	}
	return id
}

func checkMetadata(md map[string]string) error {
	if len(md) > maxMetadata {
		return runbox.Errorf(runbox.EInvalid, "metadata has %d keys; the limit is %d", len(md), maxMetadata)
	}
	for k, v := range md {
		if k == "" || len(k)+len(v) > maxMetadataBytes {
			return runbox.Errorf(runbox.EInvalid, "each metadata key must be 1 byte or more, and with its value at most %d bytes", maxMetadataBytes)
		}
	}
	return nil
}

// network maps a create's network options onto runbox's egress, never
// past the client's allowlist: internet access (E2B's default) is every
// domain the allowlist names; allowOut adds domains (each checked against
// the allowlist when the daemon's run is submitted); denyOut may only
// take everything away (0.0.0.0/0), as runbox's egress is by name, not by
// address. private says the sandbox's ports' hosts ask for its traffic
// token (allowPublicTraffic false).
func (s *Service) network(ctx context.Context, body newSandboxJSON) (*runbox.Network, bool, error) {
	var domains []string
	if body.AllowInternetAccess == nil || *body.AllowInternetAccess {
		domains = s.runs.Allowlist(ctx).Strings()
	}
	n := body.Network
	if n == nil {
		return networkOf(domains), false, nil
	}
	switch {
	case n.MaskRequestHost != "" || len(n.Rules) > 0:
		return nil, false, runbox.Errorf(runbox.EUnsupported,
			"network.maskRequestHost and network.rules are not offered; runbox's secrets (the create's secrets) add credentials to requests")
	}
	for _, d := range n.DenyOut {
		if d != "0.0.0.0/0" && d != "::/0" {
			return nil, false, runbox.Errorf(runbox.EUnsupported,
				"network.denyOut %q: runbox's egress allows domains by name; deny everything (0.0.0.0/0) and allow names in allowOut", clip(d, 64))
		}
		domains = nil
	}
	for _, d := range n.AllowOut {
		if _, err := netip.ParsePrefix(d); err == nil || isAddr(d) {
			return nil, false, runbox.Errorf(runbox.EUnsupported,
				"network.allowOut %q: runbox's egress allows domains by name, not addresses", clip(d, 64))
		}
		if _, err := egress.ParsePattern(d); err != nil {
			return nil, false, runbox.Errorf(runbox.EInvalid, "network.allowOut %q is not a domain name or *.domain pattern", clip(d, 64))
		}
		if !slices.Contains(domains, strings.ToLower(d)) {
			domains = append(domains, strings.ToLower(d))
		}
	}
	return networkOf(domains), n.AllowPublicTraffic != nil && !*n.AllowPublicTraffic, nil
}

func isAddr(s string) bool {
	_, err := netip.ParseAddr(s)
	return err == nil
}

func networkOf(domains []string) *runbox.Network {
	if len(domains) == 0 {
		return nil
	}
	return &runbox.Network{AllowedDomains: domains}
}
