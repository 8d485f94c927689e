package sandbox

import (
	"slices"
	"testing"

	"github.com/runbox-dev/runbox"
)

// TestRuntimeOptions: the engine's default runtime keeps the agent as the
// programs' user with no capability and the pids limit on the host;
// runsc runs the agent apart (root with its few capabilities, programs as
// User), holds the process limit inside gVisor and gives the host's limit
// room for the sentry.
func TestRuntimeOptions(t *testing.T) {
	limits := Limits{Memory: 512 << 20, NanoCPUs: 1e9, Pids: 128}
	for _, tt := range []struct {
		runtime  string
		user     string
		caps     []string
		env      []string
		pids     int64
		nproc    int64 // 0: none
		recycles bool
	}{
		{runtime: "", user: User, pids: 128},
		{runtime: "runc", user: User, pids: 128},
		{runtime: "runsc", user: "0:0", caps: agentCaps, env: []string{"RUNBOX_USER=" + User},
			pids: runtimePidsEach*128 + runtimePids, nproc: 128},
	} {
		t.Run(tt.runtime, func(t *testing.T) {
			rt := RuntimeFor(tt.runtime)
			m := NewManager(nil, Options{Limits: limits, Runtime: rt})
			opts := m.containerConfig(runbox.Runner{Language: "python", Image: "runner-python"}, Request{Language: "python", DataDir: "/x"})
			cfg, hc := opts.Config, opts.HostConfig
			if hc.Runtime != tt.runtime || cfg.User != tt.user || !slices.Equal(hc.CapAdd, tt.caps) || !slices.Equal(cfg.Env, tt.env) {
				t.Errorf("runtime %q user %q caps %v env %v", hc.Runtime, cfg.User, hc.CapAdd, cfg.Env)
			}
			if !slices.Equal(hc.CapDrop, []string{"ALL"}) || !slices.Contains(hc.SecurityOpt, "no-new-privileges:true") || !hc.ReadonlyRootfs {
				t.Errorf("the common limits are lost: %v %v %v", hc.CapDrop, hc.SecurityOpt, hc.ReadonlyRootfs)
			}
			if *hc.PidsLimit != tt.pids {
				t.Errorf("host pids limit %d, want %d", *hc.PidsLimit, tt.pids)
			}
			var got int64
			for _, u := range hc.Ulimits {
				if u.Name == "nproc" {
					got = u.Hard
				}
			}
			if got != tt.nproc {
				t.Errorf("nproc %d, want %d", got, tt.nproc)
			}
		})
	}
}
