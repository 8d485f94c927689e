package app

import (
	"fmt"

	"github.com/runbox-dev/runbox"
	"github.com/runbox-dev/runbox/internal/clients"
	"github.com/runbox-dev/runbox/internal/config"
	"github.com/runbox-dev/runbox/internal/egress"
	"github.com/runbox-dev/runbox/internal/gitexport"
	"github.com/runbox-dev/runbox/internal/webhooks"
	"github.com/runbox-dev/runbox/internal/webhooks/signature"
)

// Config is a process's configuration: the values package config reads
// from the environment, and the options the parts own, each read and
// checked by its part from config's value as given (config knows none of
// the parts).
type Config struct {
	*config.Config
	// Clients are the clients tokens give (MCP_API_TOKEN, MCP_API_TOKENS,
	// CLIENTS_FILE), by token digest; none: RunAPI makes a token.
	Clients clients.Clients
	// EgressPolicy is what runs may reach outside their sandboxes and the
	// secrets they may ask for.
	EgressPolicy EgressPolicy
	// WebhookPolicy is where callbacks may go (WEBHOOK_ALLOW,
	// WEBHOOK_HOSTS, and never into SANDBOX_EGRESS_DENY_CIDRS);
	// WebhookSecrets sign the client "default"'s (WEBHOOK_SECRET).
	WebhookPolicy  webhooks.Policy
	WebhookSecrets signature.Secrets
	// Git is GIT_REPOS_FILE with GIT_API_URL; nil without the file.
	Git *gitexport.Git
}

// EgressPolicy is SANDBOX_EGRESS_ALLOW, _HOSTS and _DENY_CIDRS and
// SANDBOX_SECRETS_FILE, as package egress reads them.
type EgressPolicy struct {
	// Allow is what any client may ask for; a tier's egress_domains
	// replaces it for its clients. Empty: no egress.
	Allow egress.Patterns
	Hosts egress.Hosts
	Deny  egress.Ranges
	// Secrets are the operator's secrets, which runs' requests to their
	// domains carry and their programs never see.
	Secrets egress.Secrets
}

// Load reads the configuration through getenv (os.Getenv in production):
// config's values, then each part's options from them, in the order they
// depend on each other (the clients' tiers name the egress secrets, the
// repositories name the clients). The first bad value is the error, one
// line naming its variable, so that a process stops at start.
func Load(getenv func(string) string) (*Config, error) {
	c, err := config.FromEnv(getenv)
	if err != nil {
		return nil, err
	}
	cfg := &Config{Config: c}
	if cfg.EgressPolicy, err = loadEgressPolicy(c.Egress); err != nil {
		return nil, err
	}
	// Output shown to clients carries none of the secrets' values either.
	c.Secrets = append(c.Secrets, cfg.EgressPolicy.Secrets.Values()...)
	if cfg.WebhookPolicy, cfg.WebhookSecrets, err = loadWebhookPolicy(c.Webhooks, cfg.EgressPolicy.Deny); err != nil {
		return nil, err
	}
	if cfg.Clients, err = loadClients(c, cfg.EgressPolicy.Secrets); err != nil {
		return nil, err
	}
	if c.GitReposFile != "" {
		if cfg.Git, err = gitexport.LoadGit(c.GitReposFile, c.GitAPIURL, clientNames(cfg.Clients)); err != nil {
			return nil, err
		}
	}
	return cfg, nil
}

// invalid is the error of a bad value of the variable name, worded as
// config words its own.
func invalid(name string, err error) error { return fmt.Errorf("config: %s %w", name, err) }

// loadEgressPolicy reads SANDBOX_EGRESS_ALLOW, _HOSTS and _DENY_CIDRS and
// SANDBOX_SECRETS_FILE.
func loadEgressPolicy(e config.Egress) (p EgressPolicy, err error) {
	if p.Allow, err = egress.ParseList(e.Allow); err != nil {
		return p, invalid("SANDBOX_EGRESS_ALLOW", err)
	}
	if p.Hosts, err = egress.ParseHosts(e.Hosts); err != nil {
		return p, invalid("SANDBOX_EGRESS_HOSTS", err)
	}
	if p.Deny, err = egress.ParseRanges(e.Deny); err != nil {
		return p, invalid("SANDBOX_EGRESS_DENY_CIDRS", err)
	}
	// A name mapped into a refused range could never be reached: the
	// operator meant one or the other.
	if err := outsideRanges(p.Hosts, p.Deny, "SANDBOX_EGRESS_HOSTS"); err != nil {
		return p, err
	}
	if e.SecretsFile != "" {
		if p.Secrets, err = egress.LoadSecrets(e.SecretsFile); err != nil {
			return p, invalid("SANDBOX_SECRETS_FILE", err)
		}
	}
	return p, nil
}

// outsideRanges checks that no name hosts (the variable name) maps leads
// into a range SANDBOX_EGRESS_DENY_CIDRS refuses.
func outsideRanges(hosts egress.Hosts, deny egress.Ranges, name string) error {
	for host, m := range hosts {
		if deny.Contains(m.Addr) {
			return invalid("SANDBOX_EGRESS_DENY_CIDRS", fmt.Errorf("refuses %s, where %s maps %s", m.Addr, name, host))
		}
	}
	return nil
}

// loadWebhookPolicy reads WEBHOOK_SECRET, WEBHOOK_ALLOW and WEBHOOK_HOSTS,
// the last kept out of the egress proxy's refused ranges (deny).
func loadWebhookPolicy(w config.Webhooks, deny egress.Ranges) (p webhooks.Policy, secrets signature.Secrets, err error) {
	if secrets, err = signature.Parse(w.Secret); err != nil {
		return p, secrets, invalid("WEBHOOK_SECRET", err)
	}
	p.Deny = deny
	if p.Allow, err = egress.ParseList(w.Allow); err != nil {
		return p, secrets, invalid("WEBHOOK_ALLOW", err)
	}
	if p.Hosts, err = egress.ParseHosts(w.Hosts); err != nil {
		return p, secrets, invalid("WEBHOOK_HOSTS", err)
	}
	return p, secrets, outsideRanges(p.Hosts, deny, "WEBHOOK_HOSTS")
}

// loadClients reads the clients tokens give, whose tiers may name only
// the operator's secrets.
func loadClients(c *config.Config, secrets egress.Secrets) (clients.Clients, error) {
	cs, err := clients.Load(c.APIToken, c.APITokens, c.ClientsFile)
	if err != nil {
		return nil, err
	}
	for _, cl := range cs {
		for _, name := range cl.Tier.Secrets {
			if _, ok := secrets[name]; !ok {
				return nil, invalid("CLIENTS_FILE", fmt.Errorf("tier %s: secrets names %q, which SANDBOX_SECRETS_FILE does not",
					cl.Tier.Name, truncateName(name)))
			}
		}
	}
	return cs, nil
}

func truncateName(s string) string {
	if len(s) > 64 {
		return s[:64] + "…"
	}
	return s
}

// clientNames are the names of the clients tokens give; "default" when
// there are none, as api then makes the token of the client "default".
func clientNames(cs clients.Clients) map[string]bool {
	names := map[string]bool{}
	for _, c := range cs {
		names[c.Name] = true
	}
	if len(names) == 0 {
		names[runbox.DefaultClient] = true
	}
	return names
}

// EgressReachable reports whether any client may ask its runs to reach
// anything: SANDBOX_EGRESS_ALLOW, or a tier's egress_domains, names a
// domain, or there are secrets (a run that asks for one reaches its
// domains).
func (c *Config) EgressReachable() bool {
	if len(c.EgressPolicy.Allow) > 0 || len(c.EgressPolicy.Secrets) > 0 {
		return true
	}
	for _, cl := range c.Clients {
		if len(cl.Tier.EgressDomains) > 0 {
			return true
		}
	}
	return false
}
