package kubeletnode

import (
	"context"
	"os"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"
	"k8s.io/utils/ptr"
)

type env struct {
	t      *testing.T
	ctx    context.Context
	client kubernetes.Interface
	node   *Node
}

func startNode(t *testing.T) *env {
	t.Helper()
	n, client := StartTestNode(t, "kn")
	e := &env{t: t, ctx: context.Background(), client: client, node: n}
	e.waitFor("node Ready", time.Minute, func() (bool, string) {
		node, err := client.CoreV1().Nodes().Get(e.ctx, "kn", metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		return Ready(node, time.Time{})
	})
	return e
}

func (e *env) waitFor(what string, timeout time.Duration, cond func() (bool, string)) {
	e.t.Helper()
	var last string
	err := wait.PollUntilContextTimeout(e.ctx, 100*time.Millisecond, timeout, true, func(context.Context) (bool, error) {
		if exited, err := e.node.Exited(); exited {
			last = "the kubelet exited: " + errString(err)
			return false, nil
		}
		ok, s := cond()
		last = s
		return ok, nil
	})
	if err != nil {
		e.t.Fatalf("waiting for %s: %s", what, last)
	}
}

func errString(err error) string {
	if err == nil {
		return "exit status 0"
	}
	return err.Error()
}

// TestPodLifecycle: the real kubelet registers the node, runs a pod on the fake runtime
// (recording its environment), and the pod succeeds when the test ends its container.
// Nothing of the host changes: the sysctls keep their values (StartTestNode checks).
func TestPodLifecycle(t *testing.T) {
	e := startNode(t)
	p := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "default"}, Spec: v1.PodSpec{
		NodeName: "kn", RestartPolicy: v1.RestartPolicyNever, AutomountServiceAccountToken: ptr.To(false),
		Containers: []v1.Container{{Name: "main", Image: "busybox", Env: []v1.EnvVar{{Name: "GREETING", Value: "hello"}}}},
	}}
	created, err := e.client.CoreV1().Pods("default").Create(e.ctx, p, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	e.waitFor("the pod Running", time.Minute, func() (bool, string) {
		got, err := e.client.CoreV1().Pods("default").Get(e.ctx, "p", metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		return got.Status.Phase == v1.PodRunning, string(got.Status.Phase) + " " + got.Status.Message
	})
	c, ok := e.node.Runtime.Latest(created.UID, "main")
	if !ok || c.Env["GREETING"] != "hello" || c.PodName != "p" {
		t.Errorf("container as the runtime saw it: %+v", c)
	}
	if err := e.node.Runtime.Exit(created.UID, "main", 0); err != nil {
		t.Fatal(err)
	}
	e.waitFor("the pod Succeeded", time.Minute, func() (bool, string) {
		got, err := e.client.CoreV1().Pods("default").Get(e.ctx, "p", metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		return got.Status.Phase == v1.PodSucceeded, string(got.Status.Phase)
	})
	if _, err := os.Stat("/var/lib/kubelet/device-plugins/kubelet.sock"); err == nil {
		t.Error("the kubelet wrote the host's /var/lib/kubelet")
	}
}
