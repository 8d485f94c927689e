package config

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// Operators arrive with the env files of the older specifications runbox
// serves: their names are read as aliases of runbox's own. A setting may
// be given by either name, not both.

// alias is an older name of a setting and how its value reads as the
// setting's.
type alias struct {
	name, of string
	// convert turns the alias's value into the setting's; ok false
	// leaves it as given (the setting's check then names the alias).
	convert func(string) (string, bool)
}

var aliases = []alias{
	// The Python sandbox PRD's.
	{name: "SANDBOX_EXEC_TIMEOUT_S", of: "SANDBOX_EXEC_TIMEOUT", convert: unit("s")},
	{name: "SANDBOX_SESSION_TTL_M", of: "SANDBOX_SESSION_TTL", convert: unit("m")},
	{name: "SANDBOX_MAX_ARTIFACT_READ_BYTES", of: "SANDBOX_MAX_READ_BYTES"},
	{name: "SANDBOX_LOG_LEVEL", of: "LOG_LEVEL", convert: logLevel},
	{name: "SANDBOX_LOG_FORMAT", of: "LOG_FORMAT", convert: logFormat},
}

// unit reads a whole number as a duration in u.
func unit(u string) func(string) (string, bool) {
	return func(v string) (string, bool) {
		n, err := strconv.Atoi(strings.TrimSpace(v))
		if err != nil || n <= 0 {
			return v, false
		}
		return strconv.Itoa(n) + u, true
	}
}

// logLevel reads Python's level names too.
func logLevel(v string) (string, bool) {
	switch l := strings.ToLower(strings.TrimSpace(v)); l {
	case "warning":
		return "warn", true
	case "critical", "fatal":
		return "error", true
	default:
		return l, true
	}
}

// logFormat reads "plain" and "console" as text.
func logFormat(v string) (string, bool) {
	switch f := strings.ToLower(strings.TrimSpace(v)); f {
	case "plain", "console", "pretty":
		return "text", true
	default:
		return f, true
	}
}

// withAliases returns getenv that answers a setting from its alias when
// the setting itself is not given, and the error of a setting given by
// both names.
func withAliases(getenv func(string) string) (func(string) string, error) {
	from := map[string]string{}
	for _, a := range aliases {
		v := strings.TrimSpace(getenv(a.name))
		if v == "" {
			continue
		}
		if strings.TrimSpace(getenv(a.of)) != "" {
			return nil, fmt.Errorf("config: %s and %s are the same setting; set one of them", a.of, a.name)
		}
		if a.convert != nil {
			if c, ok := a.convert(v); ok {
				v = c
			} else {
				return nil, fmt.Errorf("config: %s must be a whole number of at least 1 (got %q)", a.name, v)
			}
		}
		from[a.of] = v
	}
	// The streaming sandbox server's address: SANDBOX_HOST and
	// SANDBOX_PORT, when MCP_HTTP_ADDR is not given.
	host, port := strings.TrimSpace(getenv("SANDBOX_HOST")), strings.TrimSpace(getenv("SANDBOX_PORT"))
	if (host != "" || port != "") && strings.TrimSpace(getenv("MCP_HTTP_ADDR")) == "" {
		if port == "" {
			port = "8080"
		}
		if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
			return nil, fmt.Errorf("config: SANDBOX_PORT must be a port number (got %q)", port)
		}
		if strings.Contains(host, ":") && !strings.HasPrefix(host, "[") {
			host = "[" + host + "]"
		}
		from["MCP_HTTP_ADDR"] = host + ":" + port
	}
	return func(name string) string {
		if v, ok := from[name]; ok {
			return v
		}
		return getenv(name)
	}, nil
}

// known are the names runbox reads, besides the aliases: settings a
// SANDBOX_ or RUNBOX_ variable must be one of.
var known = []string{
	"SANDBOX_ROOT", "SANDBOX_MEMORY_LIMIT", "SANDBOX_CPU_LIMIT", "SANDBOX_PIDS_LIMIT", "SANDBOX_EXEC_TIMEOUT",
	"SANDBOX_MAX_OUTPUT_BYTES", "SANDBOX_MAX_CODE_BYTES", "SANDBOX_MAX_UPLOAD_BYTES", "SANDBOX_MAX_READ_BYTES",
	"SANDBOX_QUOTA_BYTES", "SANDBOX_QUOTA_FILES", "SANDBOX_QUOTA_MODE", "SANDBOX_SESSION_TTL",
	"SANDBOX_MAX_QUEUED_PER_CONVERSATION", "SANDBOX_MAX_QUEUED_PER_CLIENT", "SANDBOX_MAX_QUEUED_BYTES_PER_CLIENT",
	"SANDBOX_MAX_INLINE_IMAGES", "SANDBOX_MAX_INLINE_IMAGE_BYTES",
	"SANDBOX_MAX_WARM", "SANDBOX_POOL", "SANDBOX_RUNTIME", "SANDBOX_SERVER_TTL", "SANDBOX_PROJECT_TTL",
	"SANDBOX_FILE_RETENTION", "SANDBOX_EGRESS_ALLOW", "SANDBOX_EGRESS_HOSTS", "SANDBOX_EGRESS_DENY_CIDRS", "SANDBOX_EGRESS_MAX_BYTES",
	"SANDBOX_EGRESS_MAX_CONNECTIONS", "SANDBOX_EGRESS_CONNECT_TIMEOUT", "SANDBOX_EGRESS_IDLE_TIMEOUT",
	"SANDBOX_SECRETS_FILE", "SANDBOX_EGRESS_CA_FILE", "SANDBOX_ENGINE", "SANDBOX_K8S_NAMESPACE", "SANDBOX_K8S_RUNTIME_CLASS",
	"SANDBOX_RUNNERS_FILE", "SANDBOX_PIP_INDEX_URL", "SANDBOX_NPM_REGISTRY", "SANDBOX_TIMEOUT", "SANDBOX_MAX_CONCURRENT",
	"SANDBOX_MAX_PER_SESSION", "SANDBOX_MAX_SESSIONS", "SANDBOX_LOG_FILE", "SANDBOX_HOST", "SANDBOX_PORT",
	// docker-compose.yml's, and the sandbox agent's own.
	"RUNBOX_PORT", "RUNBOX_TAG", "RUNBOX_DATA", "RUNBOX_USER", "RUNBOX_REDIS_MAXMEMORY",
	"MCP_HTTP_ADDR", "MCP_API_TOKEN", "MCP_API_TOKENS", "MCP_HTTP_BODY_BUDGET", "MCP_ALLOWED_ORIGINS",
	"MCP_UNAUTHORIZED_PER_MINUTE", "MCP_TRUSTED_PROXIES",
	"WEBHOOK_SECRET", "WEBHOOK_ALLOW", "WEBHOOK_HOSTS", "WEBHOOK_BACKOFF", "WEBHOOK_RETRY_FOR",
	"WEBHOOK_CONCURRENCY_PER_CLIENT",
}

// CheckNames looks at the names of an environment (os.Environ): a
// SANDBOX_ or RUNBOX_ variable runbox does not know is an error naming
// the nearest known one, so that a misspelt limit never leaves a limit
// off; an unknown MCP_ or WEBHOOK_ variable (other tools use the
// prefixes) is only worth a warning, which it returns.
func CheckNames(environ []string) (warnings []string, err error) {
	names := slices.Clone(known)
	for _, a := range aliases {
		names = append(names, a.name)
	}
	for _, kv := range environ {
		name, _, _ := strings.Cut(kv, "=")
		if slices.Contains(names, name) {
			continue
		}
		switch {
		case strings.HasPrefix(name, "SANDBOX_") || strings.HasPrefix(name, "RUNBOX_"):
			return warnings, fmt.Errorf("config: %s is not a setting runbox knows (did you mean %s?)", name, nearest(name, names))
		case strings.HasPrefix(name, "MCP_") || strings.HasPrefix(name, "WEBHOOK_"):
			warnings = append(warnings, fmt.Sprintf("%s is not a setting runbox knows (did you mean %s?); ignored", name, nearest(name, names)))
		}
	}
	return warnings, nil
}

// nearest returns the name closest to name by edit distance.
func nearest(name string, names []string) string {
	best, bestD := "", -1
	for _, n := range names {
		if d := distance(name, n); bestD < 0 || d < bestD {
			best, bestD = n, d
		}
	}
	return best
}

// distance is the Levenshtein distance of a and b.
func distance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}
