package kubernetes

import (
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"maps"
	"regexp"
	"slices"
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
)

// Container is the name of a sandbox pod's one container.
const Container = "sandbox"

// LabelSandbox marks every pod the engine makes: the NetworkPolicy of
// deploy/kubernetes and the reaper select on it.
const LabelSandbox = "runbox.sandbox"

// AnnotationPrefix prefixes the annotations that keep label values a
// label cannot hold (see Spec.Labels).
const AnnotationPrefix = "runbox.dev/"

// Spec is a sandbox to start: a pod of Image running its own command
// (the runner's agent) with its stdin attached.
type Spec struct {
	// Name is the pod's name (PodName makes one).
	Name  string
	Image string
	// Labels mark the pod (runbox.executor, runbox.conversation, …). A
	// value Kubernetes refuses as a label's (too long, or with characters
	// such as '~') is kept whole in an annotation, and the label holds a
	// digest of it: List and selectors see the digest (LabelValue).
	Labels map[string]string
	// Env is set in the container, for the agent (RUNBOX_*) and programs.
	Env map[string]string
	// Memory (bytes) and MilliCPU bound the pod; 0 leaves them unbound.
	// The memory request equals its limit: memory cannot be taken back
	// from a program once it has it, so the pod is scheduled for all it
	// may use. The CPU request is CPURequest at most (resources).
	Memory   int64
	MilliCPU int64
	// DataSize bounds /data (an emptyDir); 0 leaves it to the node.
	DataSize int64
	// Tmpfs are memory-backed folders (emptyDir, medium Memory) of the
	// size given, by path: /tmp, the exec folder. Their pages count
	// against Memory.
	Tmpfs map[string]int64
	// Root runs the agent as root with Caps added (the agent then starts
	// programs as User itself: gVisor's runtime, sandbox.Runtime's
	// AgentApart); otherwise it runs as User with no capability.
	Root bool
	Caps []string
}

// Settings are the engine's, the same for every pod.
type Settings struct {
	Namespace string
	// RuntimeClass is the pods' runtimeClassName; "" is the cluster's
	// default.
	RuntimeClass string
	// PullPolicy is the pods' imagePullPolicy; IfNotPresent if "".
	PullPolicy corev1.PullPolicy
	// Owner, when the executor runs in the cluster in the sandboxes'
	// namespace, is its own pod: sandbox pods name it as their owner, and
	// the garbage collector removes them when it goes. Never an owner of
	// another namespace: the collector takes one as absent, and would
	// delete the sandboxes at once.
	Owner *Owner
	// Isolated, host:port, is an address the NetworkPolicy forbids
	// sandboxes (the API server's): a pod's container starts only once
	// its init container finds it unreachable. The policy's enforcer
	// writes a new pod's rules a moment after the pod has its address;
	// without this, a program of the first run could be quicker.
	Isolated string
}

// Owner is a pod, by name and UID (the downward API's POD_NAME and
// POD_UID).
type Owner struct {
	Name string
	UID  string
}

// UID and GID are those programs run as, as in every runner image.
const (
	UID = 1000
	GID = 1000
)

// DataDir is where the conversation's files are, in the pod.
const DataDir = "/data"

// podGrace is the pods' termination grace: the agent, as its container's
// init, ignores SIGTERM (it is ended by closing its input or by a kill),
// so a longer grace would only delay a deletion.
const podGrace = 1

// PodName returns a new pod name for a sandbox of language: unique, and
// valid whatever the language's key holds.
func PodName(language string) string {
	lang := strings.Trim(nameUnsafe.ReplaceAllString(strings.ToLower(language), "-"), "-")
	if len(lang) > 30 {
		lang = lang[:30]
	}
	return "runbox-" + strings.Trim(lang+"-", "-") + "-" + strings.ToLower(rand.Text()[:10])
}

var nameUnsafe = regexp.MustCompile(`[^a-z0-9-]+`)

// Pod returns the pod that runs spec under settings.
func Pod(spec Spec, s Settings) *corev1.Pod {
	labels, annotations := podLabels(spec.Labels)
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name:        spec.Name,
			Namespace:   s.Namespace,
			Labels:      labels,
			Annotations: annotations,
		},
		Spec: corev1.PodSpec{
			RestartPolicy:                 corev1.RestartPolicyNever,
			TerminationGracePeriodSeconds: ptr.To[int64](podGrace),
			AutomountServiceAccountToken:  ptr.To(false),
			EnableServiceLinks:            ptr.To(false),
			HostNetwork:                   false,
			HostPID:                       false,
			HostIPC:                       false,
			SecurityContext: &corev1.PodSecurityContext{
				RunAsNonRoot:   ptr.To(!spec.Root),
				RunAsUser:      ptr.To[int64](UID),
				RunAsGroup:     ptr.To[int64](GID),
				SeccompProfile: &corev1.SeccompProfile{Type: corev1.SeccompProfileTypeRuntimeDefault},
			},
			Containers: []corev1.Container{container(spec, s)},
			Volumes:    volumes(spec),
		},
	}
	if s.Isolated != "" {
		pod.Spec.InitContainers = []corev1.Container{isolation(spec, s)}
	}
	if s.RuntimeClass != "" {
		pod.Spec.RuntimeClassName = ptr.To(s.RuntimeClass)
	}
	if spec.Root {
		pod.Spec.SecurityContext.RunAsUser = ptr.To[int64](0)
		pod.Spec.SecurityContext.RunAsGroup = ptr.To[int64](0)
	}
	if o := s.Owner; o != nil {
		pod.OwnerReferences = []metav1.OwnerReference{{
			APIVersion: "v1", Kind: "Pod", Name: o.Name, UID: types.UID(o.UID),
		}}
	}
	return pod
}

func container(spec Spec, s Settings) corev1.Container {
	c := corev1.Container{
		Name:            Container,
		Image:           spec.Image,
		ImagePullPolicy: cmpPull(s.PullPolicy),
		WorkingDir:      DataDir,
		// The agent's protocol: stdin stays open across attaches (an
		// executor that reconnects finds it), no terminal.
		Stdin:     true,
		StdinOnce: false,
		TTY:       false,
		Env:       env(spec.Env),
		SecurityContext: &corev1.SecurityContext{
			Privileged:               ptr.To(false),
			AllowPrivilegeEscalation: ptr.To(false),
			ReadOnlyRootFilesystem:   ptr.To(true),
			Capabilities:             &corev1.Capabilities{Drop: []corev1.Capability{"ALL"}},
		},
		Resources:              resources(spec),
		VolumeMounts:           mounts(spec),
		TerminationMessagePath: corev1.TerminationMessagePathDefault,
		// Nothing the sandbox writes becomes its termination message: a
		// program could otherwise put words into the pod's status.
		TerminationMessagePolicy: corev1.TerminationMessageReadFile,
	}
	for _, cp := range spec.Caps {
		c.SecurityContext.Capabilities.Add = append(c.SecurityContext.Capabilities.Add, corev1.Capability(cp))
	}
	return c
}

// isolation is the init container that waits until the sandbox cannot
// reach s.Isolated, for isolationWait at most (then the pod fails). It is
// the sandbox's image with its lockdown, running bash (every runner has
// it): /dev/tcp connects, timeout bounds a connect that is dropped.
func isolation(spec Spec, s Settings) corev1.Container {
	host, port, _ := strings.Cut(s.Isolated, ":")
	c := container(Spec{Image: spec.Image}, s)
	c.Name = "isolated"
	c.Stdin = false
	c.Env = nil
	c.VolumeMounts = nil
	c.Command = []string{"bash", "-c", isolationScript, "isolated", host, port, fmt.Sprint(isolationWait * 10)}
	small := corev1.ResourceList{
		corev1.ResourceMemory: resource.MustParse("32Mi"),
		corev1.ResourceCPU:    resource.MustParse("100m"),
	}
	c.Resources = corev1.ResourceRequirements{Limits: small, Requests: small.DeepCopy()}
	return c
}

// isolationScript tries $1:$2 every 100 ms, $3 times at most: it
// succeeds once a connection fails.
const isolationScript = `for ((i = 0; i < $3; i++)); do
  timeout 1 bash -c 'exec 3<>"/dev/tcp/$0/$1"' "$1" "$2" 2>/dev/null || exit 0
  sleep 0.1
done
echo "$1:$2 still reachable" >&2
exit 1`

// isolationWait bounds, in seconds, the wait for a pod's isolation.
const isolationWait = 30

func cmpPull(p corev1.PullPolicy) corev1.PullPolicy {
	if p == "" {
		return corev1.PullIfNotPresent
	}
	return p
}

// env is the container's environment: spec's, AwaitEnv and DataSumEnv.
func env(m map[string]string) []corev1.EnvVar {
	var out []corev1.EnvVar
	for _, k := range slices.Sorted(maps.Keys(m)) {
		if k != AwaitEnv && k != DataSumEnv {
			out = append(out, corev1.EnvVar{Name: k, Value: m[k]})
		}
	}
	return append(out, corev1.EnvVar{Name: AwaitEnv, Value: "1"}, corev1.EnvVar{Name: DataSumEnv, Value: "1"})
}

// CPURequest is the most CPU, in millicores, a sandbox pod asks the
// scheduler for. Its limit is the run's (SANDBOX_CPU_LIMIT, a whole core
// by default) as Docker's is: a ceiling, not a reservation. A sandbox
// waits for its next run most of its life, in a warm pool or between a
// conversation's calls; with requests equal to limits a 2-core node would
// hold two sandboxes.
const CPURequest = 100

// resources are the pod's limits, the spec's, and its requests: the
// memory limit, and CPURequest of CPU (or the limit, if lower).
func resources(spec Spec) corev1.ResourceRequirements {
	limits, requests := corev1.ResourceList{}, corev1.ResourceList{}
	if spec.Memory > 0 {
		limits[corev1.ResourceMemory] = *resource.NewQuantity(spec.Memory, resource.BinarySI)
		requests[corev1.ResourceMemory] = limits[corev1.ResourceMemory]
	}
	if spec.MilliCPU > 0 {
		limits[corev1.ResourceCPU] = *resource.NewMilliQuantity(spec.MilliCPU, resource.DecimalSI)
		requests[corev1.ResourceCPU] = *resource.NewMilliQuantity(min(spec.MilliCPU, CPURequest), resource.DecimalSI)
	}
	if len(limits) == 0 {
		return corev1.ResourceRequirements{}
	}
	return corev1.ResourceRequirements{Limits: limits, Requests: requests}
}

// volumes: /data and each tmpfs, all emptyDirs: the pod gets no host
// path, and what it writes goes with it.
func volumes(spec Spec) []corev1.Volume {
	data := &corev1.EmptyDirVolumeSource{}
	if spec.DataSize > 0 {
		data.SizeLimit = resource.NewQuantity(spec.DataSize, resource.BinarySI)
	}
	vols := []corev1.Volume{{Name: "data", VolumeSource: corev1.VolumeSource{EmptyDir: data}}}
	for i, path := range slices.Sorted(maps.Keys(spec.Tmpfs)) {
		vols = append(vols, corev1.Volume{
			Name: fmt.Sprintf("tmpfs-%d", i),
			VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{
				Medium:    corev1.StorageMediumMemory,
				SizeLimit: resource.NewQuantity(spec.Tmpfs[path], resource.BinarySI),
			}},
		})
	}
	return vols
}

func mounts(spec Spec) []corev1.VolumeMount {
	ms := []corev1.VolumeMount{{Name: "data", MountPath: DataDir}}
	for i, path := range slices.Sorted(maps.Keys(spec.Tmpfs)) {
		ms = append(ms, corev1.VolumeMount{Name: fmt.Sprintf("tmpfs-%d", i), MountPath: path})
	}
	return ms
}

// podLabels returns the pod's labels, LabelSandbox among them, and the
// annotations that keep what a label could not hold.
func podLabels(in map[string]string) (labels, annotations map[string]string) {
	labels = map[string]string{LabelSandbox: "true"}
	for k, v := range in {
		lv := LabelValue(v)
		labels[k] = lv
		if lv != v {
			if annotations == nil {
				annotations = map[string]string{}
			}
			annotations[AnnotationPrefix+k] = v
		}
	}
	return labels, annotations
}

// LabelValue returns v as a pod's label holds it: v itself if Kubernetes
// takes it as a label's value, else "h-" and a digest of it.
func LabelValue(v string) string {
	if labelValue.MatchString(v) {
		return v
	}
	sum := sha256.Sum256([]byte(v))
	return "h-" + hex.EncodeToString(sum[:])[:40]
}

// labelValue is what Kubernetes takes as a label's value.
var labelValue = regexp.MustCompile(`^(([A-Za-z0-9][-A-Za-z0-9_.]{0,61})?[A-Za-z0-9])?$`)

// Label returns the value of a pod's label as it was given to Spec: the
// annotation's if the label holds a digest.
func Label(pod *corev1.Pod, key string) string {
	if v, ok := pod.Annotations[AnnotationPrefix+key]; ok && LabelValue(v) == pod.Labels[key] {
		return v
	}
	return pod.Labels[key]
}
