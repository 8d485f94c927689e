package docker

import (
	"slices"
	"testing"

	"github.com/runbox-dev/runbox/internal/sandbox/engine"
)

// TestRuntimeOptions: the engine's default runtime keeps the agent as the
// programs' user with no capability and the pids limit on the host;
// runsc runs the agent apart (root with its few capabilities, programs as
// the Spec's user), holds the process limit inside gVisor and gives the
// host's limit room for the sentry.
func TestRuntimeOptions(t *testing.T) {
	const user = "1000:1000"
	spec := engine.Spec{Name: "x", Image: "runner-python", User: user, WorkDir: "/data",
		Limits: engine.Limits{Memory: 512 << 20, NanoCPUs: 1e9, Pids: 128, OpenFiles: 1024},
		Tmpfs:  []engine.Tmpfs{{Target: "/tmp", Size: "64m"}, {Target: "/run/x", Size: "8m", Exec: true, Private: true}},
		Mounts: []engine.Mount{{Source: "/x", Target: "/data"}}}
	for _, tt := range []struct {
		runtime string
		user    string
		caps    []string
		env     []string
		pids    int64
		nproc   int64 // 0: none
	}{
		{runtime: "", user: user, pids: 128},
		{runtime: "runc", user: user, pids: 128},
		{runtime: "runsc", user: "0:0", caps: agentCaps, env: []string{"RUNBOX_USER=" + user},
			pids: runtimePidsEach*128 + runtimePids, nproc: 128},
	} {
		t.Run(tt.runtime, func(t *testing.T) {
			e := New(nil, Options{Runtime: RuntimeFor(tt.runtime)})
			opts := e.createOptions(spec)
			cfg, hc := opts.Config, opts.HostConfig
			if hc.Runtime != tt.runtime || cfg.User != tt.user || !slices.Equal(hc.CapAdd, tt.caps) || !slices.Equal(cfg.Env, tt.env) {
				t.Errorf("runtime %q user %q caps %v env %v", hc.Runtime, cfg.User, hc.CapAdd, cfg.Env)
			}
			if !slices.Equal(hc.CapDrop, []string{"ALL"}) || !slices.Contains(hc.SecurityOpt, "no-new-privileges:true") || !hc.ReadonlyRootfs ||
				hc.NetworkMode != "none" || !cfg.NetworkDisabled || hc.IpcMode != "private" || *hc.Init || hc.LogConfig.Type != "none" {
				t.Errorf("the common limits are lost: %+v %+v", cfg, hc)
			}
			if hc.Memory != hc.MemorySwap || hc.Memory != spec.Limits.Memory {
				t.Errorf("memory %d, swap %d", hc.Memory, hc.MemorySwap)
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
			want := map[string]string{"/tmp": "rw,nosuid,nodev,noexec,size=64m", "/run/x": "rw,nosuid,nodev,exec,size=8m,uid=1000,gid=1000,mode=0700"}
			if len(hc.Tmpfs) != 2 || hc.Tmpfs["/tmp"] != want["/tmp"] || hc.Tmpfs["/run/x"] != want["/run/x"] {
				t.Errorf("tmpfs %v, want %v", hc.Tmpfs, want)
			}
		})
	}
}
