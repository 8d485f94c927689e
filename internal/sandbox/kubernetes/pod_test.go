package kubernetes

import (
	"maps"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/runbox-dev/runbox/internal/agent"
	"github.com/runbox-dev/runbox/internal/sandbox/engine"
)

func TestPodLocksDown(t *testing.T) {
	spec := Spec{
		Name:     "runbox-python-abc",
		Image:    "runner-python:latest",
		Labels:   map[string]string{"runbox.executor": "ex-1", "runbox.conversation": "conv~1"},
		Env:      map[string]string{"B": "2", "A": "1"},
		Memory:   512 << 20,
		MilliCPU: 500,
		DataSize: 1 << 30,
		Tmpfs:    map[string]int64{"/tmp": 64 << 20, "/run/runbox": 32 << 20},
	}
	pod := Pod(spec, Settings{Namespace: "sandboxes"})
	ps := pod.Spec
	c := ps.Containers[0]
	mem, cpu := resource.MustParse("512Mi"), resource.MustParse("500m")
	checks := []struct {
		name string
		ok   bool
	}{
		{"namespace", pod.Namespace == "sandboxes"},
		{"one container", len(ps.Containers) == 1 && len(ps.InitContainers) == 0},
		{"never restarted", ps.RestartPolicy == corev1.RestartPolicyNever},
		{"no service account token", ps.AutomountServiceAccountToken != nil && !*ps.AutomountServiceAccountToken},
		{"no service links", ps.EnableServiceLinks != nil && !*ps.EnableServiceLinks},
		{"no host namespaces", !ps.HostNetwork && !ps.HostPID && !ps.HostIPC && ps.HostUsers == nil},
		{"non-root", *ps.SecurityContext.RunAsNonRoot && *ps.SecurityContext.RunAsUser == UID && *ps.SecurityContext.RunAsGroup == GID},
		{"seccomp RuntimeDefault", ps.SecurityContext.SeccompProfile.Type == corev1.SeccompProfileTypeRuntimeDefault},
		{"cluster's runtime", ps.RuntimeClassName == nil},
		{"no owner out of the cluster", len(pod.OwnerReferences) == 0},
		{"not privileged", !*c.SecurityContext.Privileged},
		{"no privilege escalation", !*c.SecurityContext.AllowPrivilegeEscalation},
		{"read-only root", *c.SecurityContext.ReadOnlyRootFilesystem},
		{"all capabilities dropped", len(c.SecurityContext.Capabilities.Drop) == 1 && c.SecurityContext.Capabilities.Drop[0] == "ALL" &&
			len(c.SecurityContext.Capabilities.Add) == 0},
		{"stdin attached, no tty", c.Stdin && !c.StdinOnce && !c.TTY},
		{"image's own command", c.Command == nil && c.Args == nil},
		{"IfNotPresent", c.ImagePullPolicy == corev1.PullIfNotPresent},
		{"memory limit", c.Resources.Limits.Memory().Equal(mem) && c.Resources.Requests.Memory().Equal(mem)},
		{"cpu limit, a tenth of a core asked for", c.Resources.Limits.Cpu().Equal(cpu) && c.Resources.Requests.Cpu().Equal(resource.MustParse("100m"))},
		{"env sorted, the agent awaits its peer and sums /data", len(c.Env) == 4 && c.Env[0] == corev1.EnvVar{Name: "A", Value: "1"} &&
			c.Env[2] == corev1.EnvVar{Name: AwaitEnv, Value: "1"} && c.Env[3] == corev1.EnvVar{Name: DataSumEnv, Value: "1"}},
		{"works in /data", c.WorkingDir == "/data"},
		{"sandbox label", pod.Labels[LabelSandbox] == "true"},
		{"label kept", pod.Labels["runbox.executor"] == "ex-1"},
		{"conversation digested", strings.HasPrefix(pod.Labels["runbox.conversation"], "h-")},
		{"conversation readable", Label(pod, "runbox.conversation") == "conv~1" && Label(pod, "runbox.executor") == "ex-1"},
	}
	for _, ch := range checks {
		if !ch.ok {
			t.Errorf("%s: not so in %+v", ch.name, pod)
		}
	}
	for k, v := range pod.Labels {
		if errs := validation.IsValidLabelValue(v); len(errs) > 0 {
			t.Errorf("label %s=%q: %v", k, v, errs)
		}
	}

	// Every volume an emptyDir, none a host path; the tmpfs in memory.
	want := map[string]string{"/data": "", "/tmp": "Memory", "/run/runbox": "Memory"}
	vols := map[string]corev1.Volume{}
	for _, v := range ps.Volumes {
		vols[v.Name] = v
	}
	if len(c.VolumeMounts) != len(want) || len(ps.Volumes) != len(want) {
		t.Fatalf("mounts %+v, volumes %+v; want %v", c.VolumeMounts, ps.Volumes, want)
	}
	for _, m := range c.VolumeMounts {
		v := vols[m.Name]
		medium, ok := want[m.MountPath]
		if !ok || v.EmptyDir == nil || v.HostPath != nil || string(v.EmptyDir.Medium) != medium || v.EmptyDir.SizeLimit == nil {
			t.Errorf("mount %s: volume %+v", m.MountPath, v)
		}
	}
}

func TestPodSettings(t *testing.T) {
	tests := []struct {
		name  string
		spec  Spec
		set   Settings
		check func(*corev1.Pod) bool
	}{
		{"runtime class", Spec{}, Settings{RuntimeClass: "runsc"},
			func(p *corev1.Pod) bool { return *p.Spec.RuntimeClassName == "runsc" }},
		{"pull policy", Spec{}, Settings{PullPolicy: corev1.PullNever},
			func(p *corev1.Pod) bool { return p.Spec.Containers[0].ImagePullPolicy == corev1.PullNever }},
		{"owner", Spec{}, Settings{Owner: &Owner{Name: "executor-0", UID: "u-1"}},
			func(p *corev1.Pod) bool {
				o := p.OwnerReferences
				return len(o) == 1 && o[0] == metav1.OwnerReference{APIVersion: "v1", Kind: "Pod", Name: "executor-0", UID: "u-1"}
			}},
		{"agent apart", Spec{Root: true, Caps: []string{"SETUID", "KILL"}}, Settings{},
			func(p *corev1.Pod) bool {
				sc, cs := p.Spec.SecurityContext, p.Spec.Containers[0].SecurityContext
				return !*sc.RunAsNonRoot && *sc.RunAsUser == 0 && len(cs.Capabilities.Add) == 2 &&
					cs.Capabilities.Drop[0] == "ALL" && !*cs.AllowPrivilegeEscalation
			}},
		{"isolation awaited", Spec{Image: "img"}, Settings{Isolated: "10.0.0.1:443"},
			func(p *corev1.Pod) bool {
				ic := p.Spec.InitContainers
				return len(ic) == 1 && ic[0].Image == "img" && ic[0].Command[0] == "bash" &&
					ic[0].Command[4] == "10.0.0.1" && ic[0].Command[5] == "443" &&
					*ic[0].SecurityContext.ReadOnlyRootFilesystem && ic[0].SecurityContext.Capabilities.Drop[0] == "ALL" &&
					!ic[0].Stdin && ic[0].Resources.Limits.Memory() != nil
			}},
		{"unbounded", Spec{}, Settings{},
			func(p *corev1.Pod) bool {
				r := p.Spec.Containers[0].Resources
				return r.Limits == nil && r.Requests == nil && p.Spec.Volumes[0].EmptyDir.SizeLimit == nil
			}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if p := Pod(tt.spec, tt.set); !tt.check(p) {
				t.Errorf("%+v", p)
			}
		})
	}
}

func TestPodName(t *testing.T) {
	for _, lang := range []string{"python", "@react", "template@vue", strings.Repeat("x", 300), "", "C++"} {
		name := PodName(lang)
		if errs := validation.IsDNS1123Label(name); len(errs) > 0 {
			t.Errorf("PodName(%q) = %q: %v", lang, name, errs)
		}
		if PodName(lang) == name {
			t.Errorf("PodName(%q) twice gave %q", lang, name)
		}
	}
}

func TestLabelValue(t *testing.T) {
	for _, v := range []string{"", "a", "conv_0123", "x~y", strings.Repeat("a", 63), strings.Repeat("a", 64), "-a", "a.", "é"} {
		got := LabelValue(v)
		if errs := validation.IsValidLabelValue(got); len(errs) > 0 {
			t.Errorf("LabelValue(%q) = %q: %v", v, got, errs)
		}
		if (got == v) != (len(validation.IsValidLabelValue(v)) == 0) {
			t.Errorf("LabelValue(%q) = %q: kept a bad value or changed a good one", v, got)
		}
	}
}

func TestResources(t *testing.T) {
	for _, tc := range []struct {
		milli            int64
		limit, requested string
	}{
		{2000, "2", "100m"},
		{100, "100m", "100m"},
		{50, "50m", "50m"},
	} {
		r := resources(Spec{Memory: 64 << 20, MilliCPU: tc.milli})
		if !r.Limits.Cpu().Equal(resource.MustParse(tc.limit)) || !r.Requests.Cpu().Equal(resource.MustParse(tc.requested)) ||
			!r.Requests.Memory().Equal(resource.MustParse("64Mi")) || !r.Limits.Memory().Equal(resource.MustParse("64Mi")) {
			t.Errorf("%d millicores: limits %v requests %v", tc.milli, r.Limits, r.Requests)
		}
	}
}

// TestPodSpecBounds: the bounds Docker sets with a container's ulimit and
// the executor's measure reach a pod's agent in its environment, and its
// emptyDir is the quota's size.
func TestPodSpecBounds(t *testing.T) {
	tests := []struct {
		name    string
		quota   agent.Quota
		limits  engine.Limits
		runtime string
		want    map[string]string
	}{
		{name: "all", quota: agent.Quota{Bytes: 1 << 20, Entries: 500}, limits: engine.Limits{FileSize: 1 << 20},
			want: map[string]string{FileSizeEnv: "1048576", QuotaBytesEnv: "1048576", QuotaFilesEnv: "500"}},
		{name: "none", want: map[string]string{}},
		{name: "gVisor's agent apart", quota: agent.Quota{Entries: 7}, runtime: "runsc",
			want: map[string]string{QuotaFilesEnv: "7", "RUNBOX_USER": "1000:1000"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			s := &Sandboxes{Engine: &Engine{settings: Settings{RuntimeClass: tt.runtime}}, Quota: tt.quota}
			ps, _, err := s.podSpec(engine.Spec{Name: "n", User: "1000:1000", Limits: tt.limits})
			if err != nil {
				t.Fatal(err)
			}
			if !maps.Equal(ps.Env, tt.want) || ps.DataSize != tt.quota.Bytes {
				t.Errorf("env %v, /data %d; want %v, %d", ps.Env, ps.DataSize, tt.want, tt.quota.Bytes)
			}
		})
	}
}
