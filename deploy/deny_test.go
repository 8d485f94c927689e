package deploy_test

import "testing"

// TestComposeDeniesForEveryone: SANDBOX_EGRESS_DENY_CIDRS reaches the api
// as well as the executors. The executors' egress proxy refuses its
// ranges, and so must the api's webhooks, which connect to the hosts
// clients name from the api's container (issue 46: the api sent webhooks
// without it).
func TestComposeDeniesForEveryone(t *testing.T) {
	var f struct {
		Services map[string]struct {
			Environment map[string]string `yaml:"environment"`
		} `yaml:"services"`
	}
	readCompose(t, &f)
	for _, name := range []string{"api", "executor"} {
		if v, ok := f.Services[name].Environment["SANDBOX_EGRESS_DENY_CIDRS"]; !ok || v != "${SANDBOX_EGRESS_DENY_CIDRS:-}" {
			t.Errorf("the %s is not given SANDBOX_EGRESS_DENY_CIDRS (%q, %v)", name, v, ok)
		}
	}
}
