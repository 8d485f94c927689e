package commands

import (
	"fmt"
	"strings"
	"testing"

	"github.com/runbox-dev/runbox"
)

func TestWorkingDirectory(t *testing.T) {
	tests := []struct {
		in, want string
		ok       bool
	}{
		{"", "", true},
		{"/data", "/data", true},
		{"/data/sub/../x", "/data/x", true},
		{"sub/dir", "/data/sub/dir", true},
		{"/mnt/data/x", "/data/x", true},
		{"/tmp", "/tmp", true},
		{"/tmp/build", "/tmp/build", true},
		{"/", "", false},
		{"/etc", "", false},
		{"/data/../etc", "", false},
		{"../etc", "", false},
		{"/datax", "", false},
		{"/tmpfoo", "", false},
		{"/data/\x00", "", false},
		{"/data/" + strings.Repeat("a", maxPathBytes), "", false},
	}
	for _, tt := range tests {
		got, err := workingDirectory(tt.in)
		if (err == nil) != tt.ok || got != tt.want {
			t.Errorf("workingDirectory(%q) = %q, %v; want %q (ok %v)", tt.in, got, err, tt.want, tt.ok)
		}
		if err != nil && runbox.ErrorCode(err) != runbox.EInvalid {
			t.Errorf("workingDirectory(%q): code %s", tt.in, runbox.ErrorCode(err))
		}
	}
}

func TestProgram(t *testing.T) {
	if got := program("ls", ""); got != "ls" {
		t.Fatalf("no directory: %q", got)
	}
	if got := program("pwd", "/data/it's"); got != "cd -- '/data/it'\\''s' || exit 1\npwd" {
		t.Fatalf("quoted: %q", got)
	}
}

func TestCheckEnv(t *testing.T) {
	big := map[string]string{}
	for i := range maxEnvVars + 1 {
		big[fmt.Sprintf("V%d", i)] = "1"
	}
	tests := []struct {
		name string
		env  map[string]string
		ok   bool
	}{
		{"none", nil, true},
		{"plain", map[string]string{"FOO": "bar", "_x1": ""}, true},
		{"a digit first", map[string]string{"1A": "x"}, false},
		{"a dash", map[string]string{"A-B": "x"}, false},
		{"HOME", map[string]string{"HOME": "/root"}, false},
		{"PATH", map[string]string{"PATH": "/evil"}, false},
		{"proxy, lower case", map[string]string{"https_proxy": "http://x"}, false},
		{"pip's index", map[string]string{"PIP_INDEX_URL": "http://x"}, false},
		{"npm's registry", map[string]string{"npm_config_registry": "http://x"}, false},
		{"a preload", map[string]string{"LD_PRELOAD": "/tmp/x.so"}, false},
		{"runbox's own", map[string]string{"RUNBOX_USER": "0:0"}, false},
		{"a NUL", map[string]string{"A": "x\x00"}, false},
		{"too many", big, false},
		{"too large", map[string]string{"A": strings.Repeat("x", maxEnvBytes)}, false},
	}
	for _, tt := range tests {
		if err := checkEnv(tt.env); (err == nil) != tt.ok {
			t.Errorf("%s: %v", tt.name, err)
		}
	}
}

func TestNetwork(t *testing.T) {
	tests := []struct {
		name             string
		allowed, denied  []string
		want             string
		unsupported, nil bool
	}{
		{name: "none", nil: true},
		{name: "allowed", allowed: []string{"PyPI.org.", "files.pythonhosted.org"}, want: "pypi.org,files.pythonhosted.org"},
		{name: "one denied", allowed: []string{"a.com", "b.com"}, denied: []string{"B.com"}, want: "a.com"},
		{name: "denied by a pattern", allowed: []string{"x.a.com", "b.com"}, denied: []string{"*.a.com"}, want: "b.com"},
		{name: "all denied", allowed: []string{"a.com"}, denied: []string{"a.com"}, nil: true},
		{name: "a name inside an allowed pattern", allowed: []string{"*.a.com"}, denied: []string{"x.a.com"}, unsupported: true},
		{name: "denied only", denied: []string{"a.com"}, nil: true},
	}
	for _, tt := range tests {
		sc := &SandboxConfig{Network: &NetworkConfig{AllowedDomains: tt.allowed, DeniedDomains: tt.denied}}
		n, err := sc.network()
		switch {
		case tt.unsupported:
			if runbox.ErrorCode(err) != runbox.EUnsupported || !strings.Contains(err.Error(), "denied_domains") {
				t.Errorf("%s: %v, want unsupported naming the field", tt.name, err)
			}
		case err != nil:
			t.Errorf("%s: %v", tt.name, err)
		case tt.nil:
			if n != nil {
				t.Errorf("%s: %+v, want none", tt.name, n)
			}
		case n == nil || strings.Join(n.AllowedDomains, ",") != tt.want:
			t.Errorf("%s: %+v, want %s", tt.name, n, tt.want)
		}
	}
}

func TestFilesystem(t *testing.T) {
	fs := func(f FilesystemConfig) (*runbox.Filesystem, error) {
		return (&SandboxConfig{Filesystem: &f}).filesystem()
	}
	if r, err := fs(FilesystemConfig{}); r != nil || err != nil {
		t.Fatalf("empty: %+v, %v", r, err)
	}
	r, err := fs(FilesystemConfig{AllowWrite: []string{"out", "/tmp", "/mnt/data/x"}, DenyRead: []string{"/etc/shadow", "secret"}, DenyWrite: []string{"/data/.env"}})
	if err != nil {
		t.Fatal(err)
	}
	if fmt.Sprint(r.AllowWrite, r.DenyRead, r.DenyWrite) != "[/data/out /tmp /data/x] [/etc/shadow /data/secret] [/data/.env]" {
		t.Fatalf("cleaned: %+v", r)
	}
	// Nowhere is kept as nowhere, not as no rule.
	if r, err := fs(FilesystemConfig{AllowWrite: []string{}}); err != nil || r == nil || r.AllowWrite == nil || len(r.AllowWrite) != 0 {
		t.Fatalf("allow_write []: %+v, %v", r, err)
	}
	if _, err := fs(FilesystemConfig{AllowWrite: []string{"/usr/lib"}}); runbox.ErrorCode(err) != runbox.EUnsupported || !strings.Contains(err.Error(), "allow_write") {
		t.Fatalf("a place that is not writable: %v", err)
	}
	if _, err := fs(FilesystemConfig{DenyRead: []string{"/x\x00"}}); runbox.ErrorCode(err) != runbox.EInvalid {
		t.Fatalf("a NUL: %v", err)
	}
	many := make([]string, maxRulePaths+1)
	for i := range many {
		many[i] = fmt.Sprintf("/data/%d", i)
	}
	if _, err := fs(FilesystemConfig{DenyWrite: many}); runbox.ErrorCode(err) != runbox.EInvalid {
		t.Fatalf("too many: %v", err)
	}
}
