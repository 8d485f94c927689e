package commands

import (
	"fmt"
	"path"
	"regexp"
	"slices"
	"strings"

	"github.com/runbox-dev/runbox"
)

// Bounds of what a command asks for.
const (
	maxEnvVars     = 64
	maxEnvBytes    = 64 << 10 // names and values together
	maxPathBytes   = 1024
	maxRulePaths   = 32 // per list of sandbox_config.filesystem
	maxDomainNames = 64
)

var envName = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// reservedEnv are the variables runbox sets for a sandbox's programs:
// where they live (HOME, PATH, the user), and the way out it gives them
// (the proxy, the package indexes). A command may not change them.
var reservedEnv = []string{
	"HOME", "PATH", "USER", "LOGNAME", "SHELL", "PWD",
	"HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "ALL_PROXY", "FTP_PROXY",
	"NPM_CONFIG_PROXY", "NPM_CONFIG_HTTPS_PROXY", "NPM_CONFIG_REGISTRY",
	"PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_TRUSTED_HOST", "PIP_USER", "PYTHONUSERBASE",
	"LD_PRELOAD", "LD_LIBRARY_PATH", "LD_AUDIT",
}

// checkEnv refuses environment variables a command may not set: names
// that are not shell names, runbox's own (case-insensitively, as the
// proxy settings are read in both cases), and more than the bounds.
func checkEnv(env map[string]string) error {
	if len(env) > maxEnvVars {
		return runbox.Errorf(runbox.EInvalid, "environment has %d variables; the limit is %d", len(env), maxEnvVars)
	}
	size := 0
	for k, v := range env {
		size += len(k) + len(v)
		upper := strings.ToUpper(k)
		switch {
		case !envName.MatchString(k) || len(k) > 128:
			return runbox.Errorf(runbox.EInvalid, "environment name %q is not a valid variable name", clip(k, 40))
		case slices.Contains(reservedEnv, upper) || strings.HasPrefix(upper, "RUNBOX_"):
			return runbox.Errorf(runbox.EInvalid, "environment variable %s is set by the sandbox and cannot be changed", k)
		case strings.ContainsRune(v, 0):
			return runbox.Errorf(runbox.EInvalid, "environment variable %s holds a NUL byte", k)
		}
	}
	if size > maxEnvBytes {
		return runbox.Errorf(runbox.EInvalid, "environment holds %d bytes; the limit is %d", size, maxEnvBytes)
	}
	return nil
}

// writable are the places a sandbox's programs may write, and
// working_directory may name.
var writable = []string{"/data", "/tmp"}

// sandboxPath cleans p: absolute, or relative to /data; /mnt/data is
// /data. ok is false for a path with a NUL byte or too long.
func sandboxPath(p string) (string, bool) {
	if p == "" || len(p) > maxPathBytes || strings.ContainsRune(p, 0) {
		return "", false
	}
	if !path.IsAbs(p) {
		p = path.Join("/data", p)
	}
	p = path.Clean(p)
	if p == "/mnt/data" || strings.HasPrefix(p, "/mnt/data/") {
		p = "/data" + strings.TrimPrefix(p, "/mnt/data")
	}
	return p, true
}

// under reports whether p is one of roots or beneath one.
func under(p string, roots []string) bool {
	for _, r := range roots {
		if p == r || strings.HasPrefix(p, r+"/") {
			return true
		}
	}
	return false
}

// workingDirectory checks working_directory: absolute under /data or
// /tmp, or relative to /data.
func workingDirectory(dir string) (string, error) {
	if dir == "" {
		return "", nil
	}
	p, ok := sandboxPath(dir)
	if !ok || !under(p, writable) {
		return "", runbox.Errorf(runbox.EInvalid,
			"working_directory must be under /data or /tmp (absolute), or relative to /data")
	}
	return p, nil
}

// program is the script a command runs as: the command itself, after a
// change to its working directory.
func program(command, dir string) string {
	if dir == "" || dir == "/data" {
		return command
	}
	return "cd -- " + shellQuote(dir) + " || exit 1\n" + command
}

func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

// SandboxConfig is sandbox_config: what a command may reach and touch.
type SandboxConfig struct {
	Network    *NetworkConfig    `json:"network,omitempty" jsonschema:"what the command may reach outside the sandbox"`
	Filesystem *FilesystemConfig `json:"filesystem,omitempty" jsonschema:"what the command may read and write inside the sandbox, enforced by the kernel (Landlock)"`
}

// NetworkConfig is sandbox_config.network.
type NetworkConfig struct {
	AllowedDomains []string `json:"allowed_domains,omitempty" jsonschema:"domain names (or *.domain patterns) the command may reach over HTTP(S) through runbox's proxy, within this client's allowlist"`
	DeniedDomains  []string `json:"denied_domains,omitempty" jsonschema:"domain names never reached; a name the allowed list does not name is never reached anyway"`
}

// FilesystemConfig is sandbox_config.filesystem.
type FilesystemConfig struct {
	AllowWrite []string `json:"allow_write,omitempty" jsonschema:"the only places the command may write (files or folders, with all beneath them), under /data or /tmp; missing folders are made"`
	DenyRead   []string `json:"deny_read,omitempty" jsonschema:"places the command may not read (nor list the folders that lead to them)"`
	DenyWrite  []string `json:"deny_write,omitempty" jsonschema:"places the command may not write (nor make or remove entries in the folders that lead to them)"`
}

// network returns what a command may reach: its allowed domains less the
// denied ones. A denied name that an allowed pattern would still cover
// cannot be taken out of it: that is refused, not ignored.
func (sc *SandboxConfig) network() (*runbox.Network, error) {
	if sc == nil || sc.Network == nil {
		return nil, nil
	}
	n := sc.Network
	if len(n.AllowedDomains) > maxDomainNames || len(n.DeniedDomains) > maxDomainNames {
		return nil, runbox.Errorf(runbox.EInvalid, "sandbox_config.network lists more than %d domains", maxDomainNames)
	}
	var allowed []string
	for _, a := range n.AllowedDomains {
		a = domain(a)
		if slices.ContainsFunc(n.DeniedDomains, func(d string) bool { return covers(domain(d), a) }) {
			continue
		}
		for _, d := range n.DeniedDomains {
			if d = domain(d); covers(a, d) {
				return nil, runbox.Errorf(runbox.EUnsupported,
					"sandbox_config.network.denied_domains: %s is within the allowed pattern %s; name the allowed domains one by one instead",
					clip(d, 100), clip(a, 100))
			}
		}
		allowed = append(allowed, a)
	}
	if len(allowed) == 0 {
		return nil, nil
	}
	return &runbox.Network{AllowedDomains: allowed}, nil
}

// domain is a domain name or pattern as compared.
func domain(s string) string { return strings.ToLower(strings.TrimSuffix(strings.TrimSpace(s), ".")) }

// covers reports whether pattern p (a name, or *.suffix) matches every
// name q matches.
func covers(p, q string) bool {
	if p == q {
		return true
	}
	suffix, ok := strings.CutPrefix(p, "*.")
	return ok && strings.HasSuffix(q, "."+suffix)
}

// filesystem returns the rules of sandbox_config.filesystem, checked.
func (sc *SandboxConfig) filesystem() (*runbox.Filesystem, error) {
	if sc == nil || sc.Filesystem == nil {
		return nil, nil
	}
	f := sc.Filesystem
	if f.AllowWrite == nil && f.DenyRead == nil && f.DenyWrite == nil {
		return nil, nil
	}
	out := &runbox.Filesystem{}
	lists := []struct {
		name string
		in   []string
		out  *[]string
	}{
		{"allow_write", f.AllowWrite, &out.AllowWrite},
		{"deny_read", f.DenyRead, &out.DenyRead},
		{"deny_write", f.DenyWrite, &out.DenyWrite},
	}
	for _, l := range lists {
		if len(l.in) > maxRulePaths {
			return nil, runbox.Errorf(runbox.EInvalid, "sandbox_config.filesystem.%s lists more than %d paths", l.name, maxRulePaths)
		}
		for _, p := range l.in {
			clean, ok := sandboxPath(p)
			if !ok {
				return nil, runbox.Errorf(runbox.EInvalid, "sandbox_config.filesystem.%s: %q is not a path", l.name, clip(p, 60))
			}
			if l.name == "allow_write" && !under(clean, writable) {
				return nil, runbox.Errorf(runbox.EUnsupported,
					"sandbox_config.filesystem.allow_write: %s is not writable in the sandbox (only /data and /tmp are)", clip(clean, 100))
			}
			if !slices.Contains(*l.out, clean) {
				*l.out = append(*l.out, clean)
			}
		}
	}
	// An empty allow_write (given, naming nothing) means nowhere.
	if f.AllowWrite != nil && out.AllowWrite == nil {
		out.AllowWrite = []string{}
	}
	return out, nil
}

func clip(s string, n int) string {
	if len(s) > n {
		return s[:n] + "…"
	}
	return s
}

// describe names what a filesystem rule set asks for, for errors.
func describe(f *runbox.Filesystem) string {
	var names []string
	if f.AllowWrite != nil {
		names = append(names, "allow_write")
	}
	if len(f.DenyRead) > 0 {
		names = append(names, "deny_read")
	}
	if len(f.DenyWrite) > 0 {
		names = append(names, "deny_write")
	}
	return fmt.Sprintf("sandbox_config.filesystem (%s)", strings.Join(names, ", "))
}
