package dynamicmig

import (
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/dynamig/dynamig/api"
)

// TestNodePolicyOverHost: the node policy holds for the node's CPU and memory as well as its
// GPUs. Of two nodes alike in GPUs, binpack picks the one whose CPU and memory are fuller
// (the fixed node order would pick a), spread the emptier, for a GPU pod and for a pod
// without GPU request alike; the pod's hami.io/node-scheduler-policy overrides the default.
func TestNodePolicyOverHost(t *testing.T) {
	e := newEnv(t, nil, []*v1.Node{gpuNode(t, "a", api.ModeMIG, "A100-40GB"), gpuNode(t, "b", api.ModeMIG, "A100-40GB")})
	// Half of b's CPU and memory (32 cores, 256 GiB) are requested.
	busy := &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "busy", Namespace: "default", UID: "busy-uid"},
		Spec: v1.PodSpec{NodeName: "b", Containers: []v1.Container{{Name: "c", Image: "busybox", Resources: v1.ResourceRequirements{
			Requests: v1.ResourceList{v1.ResourceCPU: resource.MustParse("16"), v1.ResourceMemory: resource.MustParse("128Gi")}}}}}}
	if _, err := e.client.CoreV1().Pods("default").Create(e.ctx, busy, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	spread := func(p *v1.Pod) *v1.Pod {
		if p.Annotations == nil {
			p.Annotations = map[string]string{}
		}
		p.Annotations[api.NodeSchedulerPolicyAnnotation] = api.PolicySpread
		return p
	}
	cpuPod := func(name string) *v1.Pod {
		return &v1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default", UID: "uid-" + "name"},
			Spec: v1.PodSpec{Containers: []v1.Container{{Name: "c", Image: "busybox", Resources: v1.ResourceRequirements{
				Requests: v1.ResourceList{v1.ResourceCPU: resource.MustParse("1")}}}}}}
	}
	for _, tc := range []struct {
		pod  *v1.Pod
		want string
	}{
		{gpuPod("gpu-binpack", api.ModeMIG, [2]int{1, 8000}), "b"},
		{spread(gpuPod("gpu-spread", api.ModeMIG, [2]int{1, 8000})), "a"},
		{cpuPod("cpu-binpack"), "b"},
		{spread(cpuPod("cpu-spread")), "a"},
	} {
		state, node, statuses := e.cycle(tc.pod)
		if node != tc.want {
			t.Errorf("%s on %q, want %s: %s", tc.pod.Name, node, tc.want, reasons(statuses))
		}
		if node != "" {
			e.pl.Unreserve(e.ctx, state, tc.pod, node)
		}
	}
}
