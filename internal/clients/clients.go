// Package clients reads who may use the service: every API token belongs
// to a named client, and every client to a tier of limits. Three sources
// may be combined: MCP_API_TOKEN (the client "default"), MCP_API_TOKENS
// (name:token[:tier], comma-separated) and CLIENTS_FILE (YAML, of which
// JSON is a subset).
package clients

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"maps"
	"os"
	"slices"
	"strings"

	"github.com/goccy/go-yaml"

	"github.com/runbox-dev/runbox"
	"github.com/runbox-dev/runbox/internal/egress"
	"github.com/runbox-dev/runbox/internal/webhooks/signature"
)

// Tier is a set of limits; a zero limit is no limit.
type Tier struct {
	Name                    string `yaml:"-"`
	CallsPerMinute          int    `yaml:"calls_per_minute"`
	NewConversationsPerHour int    `yaml:"new_conversations_per_hour"`
	ConcurrentRuns          int    `yaml:"concurrent_runs"`
	RunSecondsPerDay        int    `yaml:"run_seconds_per_day"`
	StorageBytes            int64  `yaml:"storage_bytes"`
	MaxTimeoutSeconds       int    `yaml:"max_timeout_seconds"`
	// ConcurrentRequests bounds the client's requests in flight; 0 is the
	// service's default.
	ConcurrentRequests int `yaml:"concurrent_requests"`
	// MaxQueuedRuns and MaxQueuedBytes bound the client's runs waiting to
	// start and the bytes they hold; 0 is the service's default
	// (SANDBOX_MAX_QUEUED_PER_CLIENT, SANDBOX_MAX_QUEUED_BYTES_PER_CLIENT).
	MaxQueuedRuns  int   `yaml:"max_queued_runs"`
	MaxQueuedBytes int64 `yaml:"max_queued_bytes"`
	// EgressDomains are the domain patterns the tier's clients may ask
	// their runs to reach, in place of SANDBOX_EGRESS_ALLOW; nil: that
	// list, empty: none.
	EgressDomains []string `yaml:"egress_domains"`
	// Secrets are the names of the secrets of SANDBOX_SECRETS_FILE the
	// tier's clients' runs may ask for; nil: all of them, empty: none.
	Secrets []string `yaml:"secrets"`
}

// Built-in tiers, as the contract gives them.
var builtin = map[string]Tier{
	"free":      {Name: "free", CallsPerMinute: 10, NewConversationsPerHour: 5, RunSecondsPerDay: 3600},
	"pro":       {Name: "pro", CallsPerMinute: 100, NewConversationsPerHour: 100, RunSecondsPerDay: 86400},
	"unlimited": {Name: "unlimited"},
}

// DefaultTier is the tier of a token that names none.
const DefaultTier = "unlimited"

// Client is who a token belongs to.
type Client struct {
	Name string
	Tier Tier
	// Webhook is the client's webhook settings (CLIENTS_FILE).
	Webhook Webhook
}

// Webhook is a client's webhook settings: the secrets its webhooks are
// signed with (webhook_secret: one, or the current and the previous while
// rotating), its default callback (webhook_url), the hosts its callbacks
// may go to besides WEBHOOK_ALLOW (webhook_domains), and the events it
// asks for (webhook_events). A client with none may not ask for webhooks.
type Webhook struct {
	Secrets []string
	URL     string
	Domains egress.Patterns
	Events  []string
}

// IsZero reports whether w sets nothing.
func (w Webhook) IsZero() bool {
	return len(w.Secrets) == 0 && w.URL == "" && len(w.Domains) == 0 && len(w.Events) == 0
}

// Webhooks returns the clients' webhook settings by name, for those that
// have some.
func (cs Clients) Webhooks() map[string]Webhook {
	out := map[string]Webhook{}
	for _, c := range cs {
		if !c.Webhook.IsZero() {
			out[c.Name] = c.Webhook
		}
	}
	return out
}

// stringList is a YAML value given as one string or a list of them.
type stringList []string

func (l *stringList) UnmarshalYAML(unmarshal func(any) error) error {
	var one string
	if err := unmarshal(&one); err == nil {
		*l = stringList{one}
		return nil
	}
	var many []string
	if err := unmarshal(&many); err != nil {
		return errors.New("must be a string or a list of strings")
	}
	*l = many
	return nil
}

// Digest is the SHA-256 of a token: tokens are kept and compared only as
// digests.
type Digest [32]byte

// Clients maps token digests to their clients.
type Clients map[Digest]Client

// file is CLIENTS_FILE.
type file struct {
	Clients []struct {
		Name           string     `yaml:"name"`
		Token          string     `yaml:"token"`
		TokenSHA256    string     `yaml:"token_sha256"`
		Tier           string     `yaml:"tier"`
		WebhookSecret  stringList `yaml:"webhook_secret"`
		WebhookURL     string     `yaml:"webhook_url"`
		WebhookDomains []string   `yaml:"webhook_domains"`
		WebhookEvents  []string   `yaml:"webhook_events"`
	} `yaml:"clients"`
	Tiers map[string]Tier `yaml:"tiers"`
}

// minTokenLength bounds how short a plain token may be.
const minTokenLength = 8

// Load reads the three sources. Any mistake is an error of one line that
// names its source and never a token.
func Load(token, tokens, clientsFile string) (Clients, error) {
	l := loader{clients: Clients{}, tiers: maps.Clone(builtin)}
	var f file
	if clientsFile != "" {
		b, err := os.ReadFile(clientsFile)
		if err != nil {
			return nil, fmt.Errorf("config: CLIENTS_FILE: %w", err)
		}
		if err := yaml.UnmarshalWithOptions(b, &f, yaml.Strict(), yaml.DisallowUnknownField()); err != nil {
			return nil, fmt.Errorf("config: CLIENTS_FILE %s: %s", clientsFile, firstLine(err.Error()))
		}
		for name, t := range f.Tiers {
			if !runbox.ValidClientName(name) {
				return nil, fmt.Errorf("config: CLIENTS_FILE: tier name %q must be 1 to 64 letters, digits, '_' or '-'", name)
			}
			if t.CallsPerMinute < 0 || t.NewConversationsPerHour < 0 || t.ConcurrentRuns < 0 || t.RunSecondsPerDay < 0 ||
				t.StorageBytes < 0 || t.MaxTimeoutSeconds < 0 || t.ConcurrentRequests < 0 || t.MaxQueuedRuns < 0 || t.MaxQueuedBytes < 0 {
				return nil, fmt.Errorf("config: CLIENTS_FILE: tier %s has a negative limit", name)
			}
			if _, err := egress.ParsePatterns(t.EgressDomains); err != nil {
				return nil, fmt.Errorf("config: CLIENTS_FILE: tier %s: egress_domains: %w", name, err)
			}
			t.Name = name
			l.tiers[name] = t
		}
	}
	if t := strings.TrimSpace(token); t != "" {
		if err := l.add("MCP_API_TOKEN", runbox.DefaultClient, sha256.Sum256([]byte(t)), len(t), DefaultTier, true); err != nil {
			return nil, err
		}
	}
	if err := l.parseTokens(tokens); err != nil {
		return nil, err
	}
	for i, c := range f.Clients {
		src := fmt.Sprintf("CLIENTS_FILE: client %d", i+1)
		var d Digest
		switch {
		case (c.Token == "") == (c.TokenSHA256 == ""):
			return nil, fmt.Errorf("config: %s (%q) needs exactly one of token and token_sha256", src, c.Name)
		case c.Token != "":
			d = sha256.Sum256([]byte(c.Token))
		default:
			b, err := hex.DecodeString(c.TokenSHA256)
			if err != nil || len(b) != len(d) {
				return nil, fmt.Errorf("config: %s (%q): token_sha256 must be 64 hexadecimal digits", src, c.Name)
			}
			copy(d[:], b)
		}
		length := len(c.Token)
		if c.Token == "" {
			length = minTokenLength // a digest says nothing of the token's length
		}
		if err := l.add(src, c.Name, d, length, c.Tier, false); err != nil {
			return nil, err
		}
		wh, err := webhook(c.WebhookSecret, c.WebhookURL, c.WebhookDomains, c.WebhookEvents)
		if err != nil {
			return nil, fmt.Errorf("config: %s (%q): %w", src, c.Name, err)
		}
		if err := l.setWebhook(c.Name, wh); err != nil {
			return nil, fmt.Errorf("config: %s (%q): %w", src, c.Name, err)
		}
	}
	return l.clients, nil
}

// webhook checks a client's webhook settings. Its URL is checked against
// the webhooks' policy where that is known (internal/webhooks).
func webhook(secrets []string, url string, domains, events []string) (Webhook, error) {
	if _, err := signature.Parse(secrets); err != nil {
		return Webhook{}, fmt.Errorf("webhook_secret: %w", err)
	}
	ds, err := egress.ParsePatterns(domains)
	if err != nil {
		return Webhook{}, fmt.Errorf("webhook_domains: %w", err)
	}
	for _, e := range events {
		if !slices.Contains(webhookEvents, e) {
			return Webhook{}, fmt.Errorf("webhook_events: %q is not one of %s", truncate(e), strings.Join(webhookEvents, ", "))
		}
	}
	w := Webhook{Secrets: secrets, URL: strings.TrimSpace(url), Domains: ds, Events: events}
	if len(secrets) == 0 && !w.IsZero() {
		return Webhook{}, errors.New("webhook settings without webhook_secret: its webhooks could not be signed")
	}
	return w, nil
}

// webhookEvents are the events webhook_events may name.
var webhookEvents = []string{runbox.WebhookRunStarted, runbox.WebhookRunCompleted, runbox.WebhookBatchCompleted}

// setWebhook gives the client name's entries their webhook settings: one
// client's several tokens must not give it two.
func (l *loader) setWebhook(name string, w Webhook) error {
	for d, c := range l.clients {
		if c.Name != name {
			continue
		}
		if !c.Webhook.IsZero() && !w.IsZero() && !sameWebhook(c.Webhook, w) {
			return errors.New("another entry of this client gives other webhook settings")
		}
		if !w.IsZero() {
			c.Webhook = w
			l.clients[d] = c
		}
	}
	return nil
}

func sameWebhook(a, b Webhook) bool {
	return slices.Equal(a.Secrets, b.Secrets) && a.URL == b.URL && slices.Equal(a.Domains, b.Domains) && slices.Equal(a.Events, b.Events)
}

type loader struct {
	clients Clients
	tiers   map[string]Tier
}

// parseTokens reads MCP_API_TOKENS.
func (l *loader) parseTokens(tokens string) error {
	for i, entry := range strings.Split(tokens, ",") {
		entry = strings.TrimSpace(entry)
		if entry == "" {
			continue
		}
		parts := strings.Split(entry, ":")
		if len(parts) < 2 || len(parts) > 3 {
			return fmt.Errorf("config: MCP_API_TOKENS: entry %d must be name:token or name:token:tier", i+1)
		}
		tier := ""
		if len(parts) == 3 {
			tier = parts[2]
		}
		src := fmt.Sprintf("MCP_API_TOKENS: entry %d", i+1)
		if err := l.add(src, parts[0], sha256.Sum256([]byte(parts[1])), len(parts[1]), tier, false); err != nil {
			return err
		}
	}
	return nil
}

func (l *loader) add(src, name string, d Digest, length int, tier string, isDefault bool) error {
	switch {
	case !runbox.ValidClientName(name):
		// The name is not echoed: a token given in its place would be.
		return fmt.Errorf("config: %s: the client name must be 1 to 64 letters, digits, '_' or '-'", src)
	case name == runbox.DefaultClient && !isDefault:
		return fmt.Errorf("config: %s: the client name %q is reserved for MCP_API_TOKEN", src, name)
	case length < minTokenLength:
		return fmt.Errorf("config: %s: tokens must be at least %d characters", src, minTokenLength)
	}
	if tier == "" {
		tier = DefaultTier
	}
	t, ok := l.tiers[tier]
	if !ok {
		return fmt.Errorf("config: %s: unknown tier %q", src, truncate(tier))
	}
	if prev, dup := l.clients[d]; dup {
		return fmt.Errorf("config: %s: its token is also the token of client %q; every token must be different", src, prev.Name)
	}
	l.clients[d] = Client{Name: name, Tier: t}
	return nil
}

func truncate(s string) string {
	if len(s) > 40 {
		return s[:40] + "…"
	}
	return s
}

func firstLine(s string) string {
	if i := bytes.IndexByte([]byte(s), '\n'); i >= 0 {
		return s[:i]
	}
	return s
}
