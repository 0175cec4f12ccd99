package cluster

import (
	"context"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/kubernetes"

	"github.com/dynamig/dynamig/api"
)

// AwaitAdmission dry-runs the creation of a pod named name in namespace default that asks
// for one nvidia.com/gpu and names no scheduler, shaped further by edit (nil: as it is),
// every 100 ms, until done says admission now answers as wanted (done's error ends the wait
// with it), or timeout.
func AwaitAdmission(ctx context.Context, client kubernetes.Interface, name string, timeout time.Duration, edit func(*v1.Pod), done func(*v1.Pod, error) (bool, error)) error {
	probe := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: metav1.NamespaceDefault},
		Spec: v1.PodSpec{Containers: []v1.Container{{Name: "c", Image: "busybox", Resources: v1.ResourceRequirements{
			Limits: v1.ResourceList{api.ResourceCount: resource.MustParse("1")}}}}}}
	if edit != nil {
		edit(probe)
	}
	return wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, timeout, true, func(ctx context.Context) (bool, error) {
		return done(client.CoreV1().Pods(probe.Namespace).Create(ctx, probe, metav1.CreateOptions{DryRun: []string{metav1.DryRunAll}}))
	})
}
