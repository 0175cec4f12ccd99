package kubeletnode

import (
	"context"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	"github.com/dynamig/dynamig/test/probe/report"
)

// TestContainerd: a node on real containerd and runc. The kubelet registers it and runs a
// pod of the probe image (imported, never pulled), whose container reports from inside the
// environment it was given; the pod is deleted; afterwards nothing of the node is left on
// the host (StartContainerdTestNode checks).
func TestContainerd(t *testing.T) {
	n, client := StartContainerdTestNode(t, "kc", ContainerdOptions{})
	ctx := context.Background()
	e := &env{t: t, ctx: ctx, client: client, node: n}
	e.waitFor("node Ready", 2*time.Minute, func() (bool, string) {
		node, err := client.CoreV1().Nodes().Get(ctx, "kc", metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		return Ready(node, time.Time{})
	})

	pods := client.CoreV1().Pods("default")
	p := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "p", Namespace: "default"}, Spec: v1.PodSpec{
		NodeName: "kc", RestartPolicy: v1.RestartPolicyNever, AutomountServiceAccountToken: ptr.To(false),
		Containers: []v1.Container{{Name: "main", Image: ProbeImage, ImagePullPolicy: v1.PullNever,
			Env: []v1.EnvVar{{Name: "NVIDIA_VISIBLE_DEVICES", Value: "void"}}}},
	}}
	created, err := pods.Create(ctx, p, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	e.waitFor("the pod Running", 2*time.Minute, func() (bool, string) {
		got, err := pods.Get(ctx, "p", metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		why := string(got.Status.Phase) + " " + got.Status.Message
		for _, st := range got.Status.ContainerStatuses {
			if w := st.State.Waiting; w != nil {
				why += "; " + w.Reason + ": " + w.Message
			}
		}
		return got.Status.Phase == v1.PodRunning, why
	})
	var r report.Report
	e.waitFor("the probe's report", time.Minute, func() (bool, string) {
		var err error
		r, err = n.ProbeReport(created, "main")
		return err == nil, errString(err)
	})
	if got := r.Env["NVIDIA_VISIBLE_DEVICES"]; got != "void" {
		t.Errorf("the container sees NVIDIA_VISIBLE_DEVICES=%q, want void (report %+v)", got, r)
	}

	if err := pods.Delete(ctx, "p", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	e.waitFor("the pod gone", 2*time.Minute, func() (bool, string) {
		_, err := pods.Get(ctx, "p", metav1.GetOptions{})
		return apierrors.IsNotFound(err), "still there"
	})
}
