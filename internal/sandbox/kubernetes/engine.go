package kubernetes

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/utils/ptr"

	"github.com/runbox-dev/runbox/internal/sandbox/engine"
)

// Engine makes, streams to and removes sandbox pods in one namespace.
type Engine struct {
	client   kubernetes.Interface
	config   *rest.Config
	settings Settings
}

// RESTConfig is the configuration of the cluster the engine talks to:
// the kubeconfig file at path, or, if path is "", the pod's own service
// account (the executor running in the cluster).
func RESTConfig(path string) (*rest.Config, error) {
	var (
		cfg *rest.Config
		err error
	)
	if path == "" {
		cfg, err = rest.InClusterConfig()
	} else {
		cfg, err = clientcmd.BuildConfigFromFlags("", path)
	}
	if err != nil {
		return nil, fmt.Errorf("kubernetes: cluster configuration: %w", err)
	}
	// client-go's default (5 a second) would queue a busy executor's
	// creates and deletes behind one another.
	cfg.QPS, cfg.Burst = 50, 100
	cfg.UserAgent = "runbox-executor"
	return cfg, nil
}

// New returns an engine for the cluster of cfg.
func New(cfg *rest.Config, s Settings) (*Engine, error) {
	if s.Namespace == "" {
		return nil, errors.New("kubernetes: no namespace for sandbox pods")
	}
	client, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("kubernetes: client: %w", err)
	}
	return &Engine{client: client, config: cfg, settings: s}, nil
}

// Ping checks that the API server answers and lets the engine list pods
// in its namespace.
func (e *Engine) Ping(ctx context.Context) error {
	_, err := e.pods().List(ctx, metav1.ListOptions{Limit: 1})
	if err != nil {
		return fmt.Errorf("kubernetes: list pods in %s: %w", e.settings.Namespace, err)
	}
	return nil
}

func (e *Engine) pods() podsClient { return e.client.CoreV1().Pods(e.settings.Namespace) }

type podsClient = interface {
	Create(ctx context.Context, pod *corev1.Pod, opts metav1.CreateOptions) (*corev1.Pod, error)
	Get(ctx context.Context, name string, opts metav1.GetOptions) (*corev1.Pod, error)
	List(ctx context.Context, opts metav1.ListOptions) (*corev1.PodList, error)
	Watch(ctx context.Context, opts metav1.ListOptions) (watch.Interface, error)
	Delete(ctx context.Context, name string, opts metav1.DeleteOptions) error
}

// Create makes the pod of spec and waits until its container runs. A pod
// that cannot run (its image is missing, the node refuses it) fails at
// once, with the reason the kubelet gives; one no node has room for fails
// as soon as the scheduler says so, with engine.ErrNoRoom; one that is
// not running when ctx ends fails then. Either way the pod is removed.
func (e *Engine) Create(ctx context.Context, spec Spec) (err error) {
	// Not cancelled midway: the pod would be made without our knowing.
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), apiTimeout)
	created, err := e.pods().Create(cctx, Pod(spec, e.settings), metav1.CreateOptions{})
	cancel()
	if err != nil {
		return fmt.Errorf("kubernetes: create pod: %w", err)
	}
	defer func() {
		if err != nil {
			e.Remove(spec.Name)
		}
	}()
	return e.waitRunning(ctx, created)
}

// apiTimeout bounds one call to the API server made on a context of its
// own (a create, a removal).
const apiTimeout = 30 * time.Second

// waitRunning watches pod until its container runs.
func (e *Engine) waitRunning(ctx context.Context, pod *corev1.Pod) error {
	if done, err := running(pod); done {
		return err
	}
	w, err := e.pods().Watch(ctx, metav1.ListOptions{
		FieldSelector:   fields.OneTermEqualSelector("metadata.name", pod.Name).String(),
		ResourceVersion: pod.ResourceVersion,
	})
	if err != nil {
		return fmt.Errorf("kubernetes: watch pod: %w", err)
	}
	defer w.Stop()
	last := pod
	for {
		select {
		case <-ctx.Done():
			return fmt.Errorf("kubernetes: pod %s not running (%s): %w", pod.Name, pending(last), ctx.Err())
		case ev, ok := <-w.ResultChan():
			if !ok {
				// The API server ends watches now and then: look again.
				got, err := e.pods().Get(ctx, pod.Name, metav1.GetOptions{})
				if err != nil {
					return fmt.Errorf("kubernetes: pod %s: %w", pod.Name, err)
				}
				return e.waitRunning(ctx, got)
			}
			switch ev.Type {
			case watch.Deleted:
				return fmt.Errorf("kubernetes: pod %s was deleted before it ran", pod.Name)
			case watch.Error:
				return fmt.Errorf("kubernetes: watch pod %s: %w", pod.Name, apierrors.FromObject(ev.Object))
			}
			p, ok := ev.Object.(*corev1.Pod)
			if !ok {
				continue
			}
			last = p
			if done, err := running(p); done {
				return err
			}
		}
	}
}

// running reports whether pod's container runs (done, nil), will never
// run (done, why not), or may run yet. A pod no node has room for, as the
// scheduler says (or the kubelet, which admits a pod only if it fits), is
// done with engine.ErrNoRoom: it would wait until a pod went, and the
// manager can make room by removing one of its idle sandboxes.
func running(pod *corev1.Pod) (done bool, err error) {
	switch pod.Status.Phase {
	case corev1.PodFailed:
		if strings.HasPrefix(pod.Status.Reason, "OutOf") { // OutOfcpu, OutOfmemory, OutOfpods
			return true, fmt.Errorf("kubernetes: the node refused pod %s (%s): %w", pod.Name, pod.Status.Reason, engine.ErrNoRoom)
		}
		return true, fmt.Errorf("kubernetes: pod %s ended before it ran (%s)", pod.Name, pod.Status.Reason)
	case corev1.PodSucceeded:
		return true, fmt.Errorf("kubernetes: pod %s ended before it ran (%s)", pod.Name, pod.Status.Reason)
	}
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse && c.Reason == corev1.PodReasonUnschedulable {
			return true, fmt.Errorf("kubernetes: pod %s cannot be scheduled (%s): %w", pod.Name, c.Message, engine.ErrNoRoom)
		}
	}
	for _, cs := range pod.Status.ContainerStatuses {
		switch {
		case cs.State.Running != nil:
			return true, nil
		case cs.State.Terminated != nil:
			return true, fmt.Errorf("kubernetes: the sandbox exited at once (%s, code %d)",
				cs.State.Terminated.Reason, cs.State.Terminated.ExitCode)
		case cs.State.Waiting != nil && hopeless[cs.State.Waiting.Reason]:
			return true, fmt.Errorf("kubernetes: pod %s cannot run: %s", pod.Name, cs.State.Waiting.Reason)
		}
	}
	return false, nil
}

// hopeless are the reasons a container waits for that waiting will not
// end: nothing a sandbox could be started from.
var hopeless = map[string]bool{
	"ErrImageNeverPull":          true,
	"InvalidImageName":           true,
	"ImagePullBackOff":           true,
	"ErrImagePull":               true,
	"CreateContainerConfigError": true,
	"CreateContainerError":       true,
	"RunContainerError":          true,
}

// pending says what a pod that does not run yet waits for.
func pending(pod *corev1.Pod) string {
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse {
			return "not scheduled: " + c.Reason
		}
	}
	for _, cs := range pod.Status.ContainerStatuses {
		if cs.State.Waiting != nil {
			return "waiting: " + cs.State.Waiting.Reason
		}
	}
	return "phase " + string(pod.Status.Phase)
}

// Kill ends a sandbox now: its pod is deleted without grace, and its
// attach streams end. It uses a context of its own: it is called from
// timers and cancellation.
func (e *Engine) Kill(name string) error {
	ctx, cancel := context.WithTimeout(context.Background(), apiTimeout)
	defer cancel()
	err := e.pods().Delete(ctx, name, metav1.DeleteOptions{GracePeriodSeconds: ptr.To[int64](0)})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("kubernetes: delete pod %s: %w", name, err)
	}
	return nil
}

// Remove deletes a sandbox's pod whatever its state; a pod already gone
// is no error. Deletion without grace: a sandbox keeps nothing worth a
// clean stop, and its agent ignores SIGTERM.
func (e *Engine) Remove(name string) error { return e.Kill(name) }

// State is how a sandbox's container is, as its pod's status says.
type State struct {
	Running   bool
	Exited    bool
	ExitCode  int
	OOMKilled bool
}

// ErrGone reports a sandbox whose pod no longer exists.
var ErrGone = errors.New("kubernetes: the sandbox's pod is gone")

// Inspect returns the state of a sandbox's container.
func (e *Engine) Inspect(ctx context.Context, name string) (State, error) {
	pod, err := e.pods().Get(ctx, name, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return State{}, ErrGone
	}
	if err != nil {
		return State{}, fmt.Errorf("kubernetes: get pod %s: %w", name, err)
	}
	return stateOf(pod), nil
}

func stateOf(pod *corev1.Pod) State {
	for _, cs := range pod.Status.ContainerStatuses {
		if cs.Name != Container {
			continue
		}
		if t := cs.State.Terminated; t != nil {
			return State{Exited: true, ExitCode: int(t.ExitCode), OOMKilled: t.Reason == "OOMKilled"}
		}
		return State{Running: cs.State.Running != nil}
	}
	return State{}
}

// WaitExited waits until a sandbox's container has exited, its pod is
// gone, or ctx ends, and returns its last state.
func (e *Engine) WaitExited(ctx context.Context, name string) (State, error) {
	for {
		st, err := e.Inspect(ctx, name)
		if err != nil || st.Exited {
			return st, err
		}
		select {
		case <-ctx.Done():
			return st, ctx.Err()
		case <-time.After(exitPoll):
		}
	}
}

// exitPoll is how often WaitExited looks: it waits seconds at most, for
// a container its agent's stream says has ended.
const exitPoll = 100 * time.Millisecond

// Sandbox is a sandbox pod as List finds it.
type Sandbox struct {
	Name    string
	Labels  map[string]string // as Spec gave them (Label)
	Created time.Time
	State   State
}

// List returns the sandbox pods whose labels match match (values as Spec
// gave them).
func (e *Engine) List(ctx context.Context, match map[string]string) ([]Sandbox, error) {
	sel := labels.Set{LabelSandbox: "true"}
	for k, v := range match {
		sel[k] = LabelValue(v)
	}
	list, err := e.pods().List(ctx, metav1.ListOptions{LabelSelector: labels.SelectorFromSet(sel).String()})
	if err != nil {
		return nil, fmt.Errorf("kubernetes: list pods: %w", err)
	}
	out := make([]Sandbox, 0, len(list.Items))
	for i := range list.Items {
		p := &list.Items[i]
		ls := make(map[string]string, len(p.Labels))
		for k := range p.Labels {
			ls[k] = Label(p, k)
		}
		out = append(out, Sandbox{Name: p.Name, Labels: ls, Created: p.CreationTimestamp.Time, State: stateOf(p)})
	}
	return out, nil
}

// Reap removes the sandbox pods that match match, that keep does not
// claim and that are older than minAge: those of an executor that went
// away without removing them. It returns how many it removed.
func (e *Engine) Reap(ctx context.Context, match map[string]string, keep func(Sandbox) bool, minAge time.Duration) (int, error) {
	found, err := e.List(ctx, match)
	if err != nil {
		return 0, err
	}
	n := 0
	var errs []error
	for _, sb := range found {
		if time.Since(sb.Created) < minAge || (keep != nil && keep(sb)) {
			continue
		}
		if err := e.Remove(sb.Name); err != nil {
			errs = append(errs, err)
			continue
		}
		n++
	}
	return n, errors.Join(errs...)
}
