package kubernetes

import (
	"context"
	"errors"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"

	"github.com/runbox-dev/runbox/internal/sandbox/engine"
)

// TestRunning: what a pod's status says of a sandbox that is starting.
func TestRunning(t *testing.T) {
	unschedulable := corev1.PodCondition{Type: corev1.PodScheduled, Status: corev1.ConditionFalse,
		Reason: corev1.PodReasonUnschedulable, Message: "0/1 nodes are available: 1 Insufficient cpu."}
	waiting := func(reason string) []corev1.ContainerStatus {
		return []corev1.ContainerStatus{{Name: Container, State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: reason}}}}
	}
	for _, tt := range []struct {
		name   string
		status corev1.PodStatus
		done   bool
		noRoom bool
		failed bool
	}{
		{name: "just made", status: corev1.PodStatus{Phase: corev1.PodPending}},
		{name: "scheduled, pulling", status: corev1.PodStatus{Phase: corev1.PodPending, ContainerStatuses: waiting("ContainerCreating"),
			Conditions: []corev1.PodCondition{{Type: corev1.PodScheduled, Status: corev1.ConditionTrue}}}},
		{name: "running", done: true, status: corev1.PodStatus{Phase: corev1.PodRunning, ContainerStatuses: []corev1.ContainerStatus{
			{Name: Container, State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}}}}},
		{name: "no node has room", done: true, noRoom: true, failed: true,
			status: corev1.PodStatus{Phase: corev1.PodPending, Conditions: []corev1.PodCondition{unschedulable}}},
		{name: "gated, not unschedulable", status: corev1.PodStatus{Phase: corev1.PodPending, Conditions: []corev1.PodCondition{
			{Type: corev1.PodScheduled, Status: corev1.ConditionFalse, Reason: corev1.PodReasonSchedulingGated}}}},
		{name: "the kubelet refused it for CPU", done: true, noRoom: true, failed: true,
			status: corev1.PodStatus{Phase: corev1.PodFailed, Reason: "OutOfcpu"}},
		{name: "the kubelet refused it otherwise", done: true, failed: true,
			status: corev1.PodStatus{Phase: corev1.PodFailed, Reason: "NodeAffinity"}},
		{name: "image missing", done: true, failed: true,
			status: corev1.PodStatus{Phase: corev1.PodPending, ContainerStatuses: waiting("ErrImageNeverPull")}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			done, err := running(&corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p"}, Status: tt.status})
			if done != tt.done || (err != nil) != tt.failed || errors.Is(err, engine.ErrNoRoom) != tt.noRoom {
				t.Fatalf("running: %v, %v; want done %v, failed %v, no room %v", done, err, tt.done, tt.failed, tt.noRoom)
			}
		})
	}
}

// TestCreateWithoutRoom: a pod the scheduler finds no room for ends
// Create with engine.ErrNoRoom, and is removed.
func TestCreateWithoutRoom(t *testing.T) {
	client := fake.NewClientset()
	e := &Engine{client: client, settings: Settings{Namespace: "sandboxes"}}
	spec := Spec{Name: PodName("python"), Image: "runner-python:latest", MilliCPU: 1000, Memory: 256 << 20}
	ctx, cancel := context.WithTimeout(t.Context(), time.Minute)
	defer cancel()
	created := make(chan error, 1)
	go func() { created <- e.Create(ctx, spec) }()

	// The scheduler's verdict, once the pod is there; said again until
	// Create ends, as the fake's watch replays nothing said before it.
	pods := client.CoreV1().Pods("sandboxes")
	var err error
	for done := false; !done; {
		select {
		case err = <-created:
			done = true
		case <-ctx.Done():
			t.Fatal("Create did not end")
		case <-time.After(10 * time.Millisecond):
			pod, err := pods.Get(ctx, spec.Name, metav1.GetOptions{})
			if apierrors.IsNotFound(err) {
				continue
			}
			if err != nil {
				t.Fatal(err)
			}
			pod.Status.Phase = corev1.PodPending
			pod.Status.Conditions = []corev1.PodCondition{{Type: corev1.PodScheduled, Status: corev1.ConditionFalse,
				Reason: corev1.PodReasonUnschedulable, Message: "0/1 nodes are available: 1 Insufficient cpu."}}
			if _, err := pods.UpdateStatus(ctx, pod, metav1.UpdateOptions{}); err != nil && !apierrors.IsNotFound(err) {
				t.Fatal(err)
			}
		}
	}
	if !errors.Is(err, engine.ErrNoRoom) {
		t.Fatalf("Create: %v; want ErrNoRoom", err)
	}
	if _, err := pods.Get(ctx, spec.Name, metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Fatalf("the pending pod was left: %v", err)
	}
}
