package config

import (
	"slices"
	"strings"
	"testing"
	"time"
)

// TestAliases: the older specifications' names set runbox's settings,
// converted to their units; a setting given by both names is refused.
func TestAliases(t *testing.T) {
	c, err := FromEnv(env(map[string]string{
		"SANDBOX_HOST": "0.0.0.0", "SANDBOX_PORT": "9100",
		"SANDBOX_EXEC_TIMEOUT_S": "45", "SANDBOX_SESSION_TTL_M": "15", "SANDBOX_MAX_ARTIFACT_READ_BYTES": "1234",
		"SANDBOX_LOG_LEVEL": "WARNING", "SANDBOX_LOG_FORMAT": "json", "SANDBOX_LOG_FILE": "/tmp/runbox.log",
		"SANDBOX_TIMEOUT": "120", "SANDBOX_MAX_CONCURRENT": "0", "SANDBOX_MAX_PER_SESSION": "3", "SANDBOX_MAX_SESSIONS": "7",
	}))
	if err != nil {
		t.Fatal(err)
	}
	if c.HTTPAddr != "0.0.0.0:9100" || c.ExecTimeout != 45*time.Second || c.SessionTTL != 15*time.Minute || c.MaxRead != 1234 ||
		c.LogLevel != "warn" || c.LogFormat != "json" || c.LogFile != "/tmp/runbox.log" || c.CommandTimeout != 2*time.Minute ||
		c.MaxConcurrent != 0 || c.MaxPerSession != 3 || c.MaxSessions != 7 {
		t.Errorf("%+v", c)
	}
	if c, _ := FromEnv(env(map[string]string{"SANDBOX_PORT": "9100", "MCP_HTTP_ADDR": "127.0.0.1:7000"})); c.HTTPAddr != "127.0.0.1:7000" {
		t.Errorf("MCP_HTTP_ADDR gives way to SANDBOX_PORT: %s", c.HTTPAddr)
	}
	if c, _ := FromEnv(env(map[string]string{"SANDBOX_PORT": "9100"})); c.HTTPAddr != ":9100" {
		t.Errorf("SANDBOX_PORT alone: %s", c.HTTPAddr)
	}
	if c, _ := FromEnv(env(nil)); c.CommandTimeout != 300*time.Second || c.MaxConcurrent != 10 || c.MaxPerSession != 5 || c.MaxSessions != 0 {
		t.Errorf("defaults %+v", c)
	}
	for _, bad := range []map[string]string{
		{"SANDBOX_EXEC_TIMEOUT_S": "45", "SANDBOX_EXEC_TIMEOUT": "45s"},
		{"SANDBOX_EXEC_TIMEOUT_S": "soon"},
		{"SANDBOX_PORT": "99999"},
		{"SANDBOX_MAX_PER_SESSION": "0"},
	} {
		if _, err := FromEnv(env(bad)); err == nil {
			t.Errorf("%v accepted", bad)
		}
	}
	_, err = FromEnv(env(map[string]string{"SANDBOX_SESSION_TTL_M": "1", "SANDBOX_SESSION_TTL": "1m"}))
	if err == nil || !strings.Contains(err.Error(), "SANDBOX_SESSION_TTL_M") {
		t.Errorf("both names: %v", err)
	}
}

// TestCheckNames: a SANDBOX_ or RUNBOX_ name runbox does not read stops
// it with the nearest one it does; an unknown MCP_ name is a warning;
// others are not runbox's business.
func TestCheckNames(t *testing.T) {
	if w, err := CheckNames([]string{"SANDBOX_MEMORY_LIMIT=1g", "SANDBOX_EXEC_TIMEOUT_S=3", "PATH=/bin", "HOME=/root", "MCP_API_TOKEN=x"}); err != nil || w != nil {
		t.Fatalf("known names: %v, %v", w, err)
	}
	_, err := CheckNames([]string{"SANDBOX_MEMORY_LIMT=1g"})
	if err == nil || !strings.Contains(err.Error(), "SANDBOX_MEMORY_LIMT") || !strings.Contains(err.Error(), "did you mean SANDBOX_MEMORY_LIMIT") {
		t.Fatalf("a typo: %v", err)
	}
	if _, err := CheckNames([]string{"RUNBOX_PROT=8080"}); err == nil || !strings.Contains(err.Error(), "RUNBOX_PORT") {
		t.Fatalf("RUNBOX_: %v", err)
	}
	w, err := CheckNames([]string{"MCP_SERVER_NAME=x"})
	if err != nil || len(w) != 1 || !strings.Contains(w[0], "MCP_SERVER_NAME") {
		t.Fatalf("MCP_: %v, %v", w, err)
	}
}

// TestKnownNames: every name FromEnv reads is known to CheckNames.
func TestKnownNames(t *testing.T) {
	var read []string
	_, _ = FromEnv(func(name string) string {
		read = append(read, name)
		return ""
	})
	for _, name := range read {
		if (strings.HasPrefix(name, "SANDBOX_") || strings.HasPrefix(name, "RUNBOX_") || strings.HasPrefix(name, "MCP_")) && !slices.Contains(known, name) &&
			!slices.ContainsFunc(aliases, func(a alias) bool { return a.name == name }) {
			t.Errorf("FromEnv reads %s, which CheckNames does not know", name)
		}
	}
}
