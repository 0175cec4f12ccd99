package dynamicmig

import (
	"strings"
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/dynamig/dynamig/api"
)

func gpuQuotaObject(name string, hard map[string]int64) *v1.ResourceQuota {
	q := &v1.ResourceQuota{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "default"}, Spec: v1.ResourceQuotaSpec{Hard: v1.ResourceList{}}}
	for k, v := range hard {
		q.Spec.Hard[v1.ResourceName(k)] = *resource.NewQuantity(v, resource.DecimalSI)
	}
	return q
}

// TestNamespaceGPUQuota: a ResourceQuota's limits.nvidia.com/gpumem bounds the memory the
// namespace's pods are granted — a MIG device's whole profile, not the MiB asked — counting
// bound pods and pods reserved but not bound yet; the pod refused names the quota, the use,
// the limit and its grant, and is activated when the quota changes.
func TestNamespaceGPUQuota(t *testing.T) {
	quota := gpuQuotaObject("gpu", map[string]int64{"limits." + api.ResourceMemory: 20000, "requests.cpu": 10})
	e := newEnv(t, nil, []*v1.Node{gpuNode(t, "n", api.ModeMIG, "A100-40GB", "A100-40GB")}, quota)
	// 8,000 MiB asked is a 2g.10gb, 9,856 MiB granted.
	e.mustSchedule(gpuPod("a", api.ModeMIG, [2]int{1, 8000}))
	b := gpuPod("b", api.ModeMIG, [2]int{1, 8000})
	if _, err := e.client.CoreV1().Pods("default").Create(e.ctx, b, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// b is reserved (assumed), not bound: c's cycle must count it.
	_, node, statuses := e.cycle(b)
	if node == "" {
		t.Fatalf("b fits the quota (19,712 of 20,000 MiB): %s", reasons(statuses))
	}
	b.Spec.NodeName = node
	c := gpuPod("c", api.ModeMIG, [2]int{1, 1000})
	if _, err := e.client.CoreV1().Pods("default").Create(e.ctx, c, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	_, node, statuses = e.cycle(c, b)
	want := reasonQuota + ": ResourceQuota default/gpu limits.nvidia.com/gpumem: 19712 used of 20000, and the pod would be granted 4864 on this node"
	if node != "" || statuses["n"] == nil || statuses["n"].Message() != want || statuses["n"].Code() != 3 /* UnschedulableAndUnresolvable */ {
		t.Fatalf("c (a 1g.5gb, 4,864 MiB) must be refused by the quota:\n got %s\nwant %s", reasons(statuses), want)
	}
	// Another namespace's pods do not count, nor does a quota without GPU limits.
	other := gpuPod("d", api.ModeMIG, [2]int{1, 8000})
	other.Namespace = "team"
	if _, err := e.client.CoreV1().Pods("team").Create(e.ctx, other, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	state, node, statuses := e.cycle(other, b)
	if node == "" {
		t.Fatalf("another namespace's pod is not limited: %s", reasons(statuses))
	}
	e.pl.Unreserve(e.ctx, state, other, node)

	quota.Spec.Hard[v1.ResourceName("limits."+api.ResourceMemory)] = *resource.NewQuantity(30000, resource.DecimalSI)
	activated := e.activator.waitFor(t, "default/c", func() {
		if _, err := e.client.CoreV1().ResourceQuotas("default").Update(e.ctx, quota, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	})
	if !activated {
		t.Fatal("raising the quota must activate the pod it refused")
	}
	waitFor(t, func() bool {
		q, err := e.pl.quotaLister.ResourceQuotas("default").Get("gpu")
		return err == nil && q.Spec.Hard.Name(v1.ResourceName("limits."+api.ResourceMemory), resource.DecimalSI).Value() == 30000
	})
	if _, node, statuses := e.cycle(c, b); node == "" {
		t.Fatalf("c fits the raised quota: %s", reasons(statuses))
	}
}

// TestNamespaceGPUCoresQuota: limits.nvidia.com/gpucores counts a MIG device's SMs as a
// percentage of the GPU's, and a hami-core share's cores; a pod whose grant passes it is
// refused, and the other limit of the namespace's quotas is checked as well.
func TestNamespaceGPUCoresQuota(t *testing.T) {
	quota := gpuQuotaObject("cores", map[string]int64{"limits." + api.ResourceCores: 60})
	e := newEnv(t, nil, []*v1.Node{gpuNode(t, "n", api.ModeMIG, "A100-40GB", "A100-40GB")}, quota)
	// A 3g.20gb has 42 of the A100's 98 SMs: 43 %.
	e.mustSchedule(gpuPod("a", api.ModeMIG, [2]int{1, 16000}))
	p, statuses := e.schedule(gpuPod("b", api.ModeMIG, [2]int{1, 16000}))
	if p != nil || !strings.Contains(reasons(statuses), "ResourceQuota default/cores limits.nvidia.com/gpucores: 43 used of 60, and the pod would be granted 43") {
		t.Fatalf("b must be refused by the cores quota: %s", reasons(statuses))
	}
	if _, waiting := e.pl.quotaWaiting.pods["default"][e.pod("b").UID]; !waiting {
		t.Error("the refused pod waits for a quota change")
	}
	if err := e.client.CoreV1().Pods("default").Delete(e.ctx, "b", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() bool {
		e.pl.quotaWaiting.mu.Lock()
		defer e.pl.quotaWaiting.mu.Unlock()
		return len(e.pl.quotaWaiting.pods["default"]) == 0
	})
}

// TestNamespaceGPUQuotaHAMiCore: a hami-core device counts its share's memory.
func TestNamespaceGPUQuotaHAMiCore(t *testing.T) {
	quota := gpuQuotaObject("gpu", map[string]int64{"limits." + api.ResourceMemory: 10000})
	e := newEnv(t, nil, []*v1.Node{gpuNode(t, "n", api.ModeHAMiCore, "A100-40GB")}, quota)
	if p, statuses := e.schedule(gpuPod("a", api.ModeHAMiCore, [2]int{1, 6000})); p == nil {
		t.Fatalf("a: %s", reasons(statuses))
	}
	if p, statuses := e.schedule(gpuPod("b", api.ModeHAMiCore, [2]int{1, 4000})); p == nil {
		t.Fatalf("b fits the quota (10,000 of 10,000 MiB): %s", reasons(statuses))
	}
	if p, statuses := e.schedule(gpuPod("c", api.ModeHAMiCore, [2]int{1, 1})); p != nil || !strings.Contains(reasons(statuses), "10000 used of 10000, and the pod would be granted 1 ") {
		t.Fatalf("c must be refused: %s", reasons(statuses))
	}
}
