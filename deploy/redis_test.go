package deploy_test

import (
	"os"
	"slices"
	"testing"

	"github.com/goccy/go-yaml"
)

// TestComposeBoundsRedis: the stack's Redis has a memory bound and never
// evicts (runbox's state must not be dropped to make room: past the bound
// writes are refused, and the api and executors say so).
func TestComposeBoundsRedis(t *testing.T) {
	var f struct {
		Services map[string]struct {
			Command []string `yaml:"command"`
		} `yaml:"services"`
	}
	readCompose(t, &f)
	cmd := f.Services["redis"].Command
	at := func(flag string) string {
		i := slices.Index(cmd, flag)
		if i < 0 || i+1 >= len(cmd) {
			return ""
		}
		return cmd[i+1]
	}
	if at("--maxmemory") == "" || at("--maxmemory-policy") != "noeviction" {
		t.Errorf("redis runs %q: want --maxmemory and --maxmemory-policy noeviction", cmd)
	}
	if at("--appendonly") != "yes" {
		t.Errorf("redis runs %q: the image's AOF settings are lost", cmd)
	}
}

// readCompose decodes docker-compose.yml into v.
func readCompose(t *testing.T, v any) {
	t.Helper()
	b, err := os.ReadFile("../docker-compose.yml")
	if err != nil {
		t.Fatal(err)
	}
	if err := yaml.Unmarshal(b, v); err != nil {
		t.Fatal(err)
	}
}
