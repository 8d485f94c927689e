package projects

import (
	"regexp"
	"slices"
	"strings"
)

// Redacted replaces every secret in what a project's output shows.
const Redacted = "[REDACTED]"

// Patterns of secrets: keys, tokens and passwords as the common services
// and programs print them. Where a pattern has a group, only the group is
// the secret.
var secretPatterns = []*regexp.Regexp{
	regexp.MustCompile(`-----BEGIN [A-Z ]*PRIVATE KEY-----[\s\S]*?(?:-----END [A-Z ]*PRIVATE KEY-----|$)`),
	regexp.MustCompile(`\b(?:gh[pousr]_[A-Za-z0-9]{30,}|github_pat_[A-Za-z0-9_]{30,})`),
	regexp.MustCompile(`\b(?:AKIA|ASIA)[A-Z0-9]{16}\b`),
	regexp.MustCompile(`\bsk-[A-Za-z0-9_-]{16,}`),
	regexp.MustCompile(`\b(?:sk|rk|pk)_(?:live|test)_[A-Za-z0-9]{16,}`),
	regexp.MustCompile(`\bxox[abprs]-[A-Za-z0-9-]{10,}`),
	regexp.MustCompile(`\bAIza[0-9A-Za-z_-]{35}`),
	regexp.MustCompile(`\beyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}`),
	regexp.MustCompile(`\brb_[A-Z2-7]{20,}`), // runbox's generated API tokens
	// Credentials in URLs, headers and assignments.
	regexp.MustCompile(`://[^/\s:@]+:([^/\s@]+)@`),
	regexp.MustCompile(`(?i)\b(?:bearer|token|basic)\s+([A-Za-z0-9._~+/-]{16,}=*)`),
	regexp.MustCompile(`(?i)[?&](?:access_token|token|api_?key|key|secret|password|sig|signature)=([^&\s"'#]+)`),
	regexp.MustCompile(`(?i)\b[A-Za-z0-9_.-]*(?:api[_-]?key|secret|token|passw(?:or)?d|pwd|access[_-]?key|private[_-]?key|credential)s?["']?\s*[:=]\s*["']?([^\s"',;&}]{4,})`),
}

// Redactor takes secrets out of text: the patterns above, and the
// service's own secrets (its tokens and keys) wherever they appear.
type Redactor struct {
	literals []string
}

// NewRedactor returns a Redactor that also takes out each of secrets
// (those shorter than 8 bytes are too common to be taken as secrets).
func NewRedactor(secrets ...string) *Redactor {
	r := &Redactor{}
	for _, s := range secrets {
		if len(s) >= 8 && !slices.Contains(r.literals, s) {
			r.literals = append(r.literals, s)
		}
	}
	// Longest first, so that a secret holding another goes whole.
	slices.SortFunc(r.literals, func(a, b string) int { return len(b) - len(a) })
	return r
}

// Redact returns text without secrets.
func (r *Redactor) Redact(text string) string {
	for _, s := range r.literals {
		text = strings.ReplaceAll(text, s, Redacted)
	}
	for _, p := range secretPatterns {
		text = p.ReplaceAllStringFunc(text, func(m string) string {
			sub := p.FindStringSubmatchIndex(m)
			if len(sub) < 4 || sub[2] < 0 {
				return Redacted
			}
			return m[:sub[2]] + Redacted + m[sub[3]:]
		})
	}
	return text
}
