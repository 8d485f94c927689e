package deploy_test

import (
	"os"
	"testing"

	"github.com/goccy/go-yaml"
)

// TestComposeDeniesForEveryone: SANDBOX_EGRESS_DENY_CIDRS reaches the api
// as well as the executors. The executors' egress proxy refuses its
// ranges, and so must the api's webhooks, which connect to the hosts
// clients name from the api's container (issue 46: the api sent webhooks
// without it).
func TestComposeDeniesForEveryone(t *testing.T) {
	b, err := os.ReadFile("../docker-compose.yml")
	if err != nil {
		t.Fatal(err)
	}
	var f struct {
		Services map[string]struct {
			Environment map[string]string `yaml:"environment"`
		} `yaml:"services"`
	}
	if err := yaml.Unmarshal(b, &f); err != nil {
		t.Fatal(err)
	}
	for _, name := range []string{"api", "executor"} {
		if v, ok := f.Services[name].Environment["SANDBOX_EGRESS_DENY_CIDRS"]; !ok || v != "${SANDBOX_EGRESS_DENY_CIDRS:-}" {
			t.Errorf("the %s is not given SANDBOX_EGRESS_DENY_CIDRS (%q, %v)", name, v, ok)
		}
	}
}
