package inspect

import (
	"testing"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/dynamig/dynamig/api"
	"github.com/dynamig/dynamig/config"
	"github.com/dynamig/dynamig/plugins/dynamicmig/quota"
)

// TestQuotas: a namespace's use counts its bound pods' MIG profiles (a 2g.10gb is 9,856 MiB
// and 29 % of an A100) against each ResourceQuota that limits GPU memory or cores; an ended
// pod and a pod of another namespace do not count; a namespace granted GPU memory without a
// quota has a row without a limit.
func TestQuotas(t *testing.T) {
	n := node(t, "n", a100(t, "GPU-a"))
	inv, err := api.DecodeInventory(n.Annotations[api.NodeInventoryAnnotation])
	if err != nil {
		t.Fatal(err)
	}
	p, ok := inv[0].Profile("2g.10gb")
	if !ok {
		t.Fatal("no 2g.10gb")
	}
	running := migPod(t, "a", "n", "success", rec("GPU-a", "2g.10gb", 0, 2), rec("GPU-a", "2g.10gb", 2, 2))
	ended := migPod(t, "b", "n", "success", rec("GPU-a", "2g.10gb", 4, 2))
	ended.Status.Phase = v1.PodSucceeded
	other := migPod(t, "c", "n", "success", rec("GPU-a", "2g.10gb", 4, 2))
	other.Namespace = "team"
	quotas := []v1.ResourceQuota{
		{ObjectMeta: metav1.ObjectMeta{Name: "gpu", Namespace: "default"}, Spec: v1.ResourceQuotaSpec{Hard: v1.ResourceList{
			"limits.nvidia.com/gpumem": resource.MustParse("20000"), "limits.nvidia.com/gpucores": resource.MustParse("50")}}},
		{ObjectMeta: metav1.ObjectMeta{Name: "cpu", Namespace: "default"}, Spec: v1.ResourceQuotaSpec{Hard: v1.ResourceList{"requests.cpu": resource.MustParse("4")}}},
	}
	got := Quotas([]v1.Node{n}, []v1.Pod{running, ended, other}, quotas, quota.NamesOf(api.ResourceMemory, api.ResourceCores))
	mem, cores := int64(2*p.MemoryMB), int64(2*p.Core)
	want := []QuotaUse{
		{Namespace: "default", Quota: "gpu", Resource: "limits.nvidia.com/gpucores", Used: cores, Limit: ptrTo(50)},
		{Namespace: "default", Quota: "gpu", Resource: "limits.nvidia.com/gpumem", Used: mem, Limit: ptrTo(20000)},
		{Namespace: "team", Resource: "limits.nvidia.com/gpucores", Used: int64(p.Core)},
		{Namespace: "team", Resource: "limits.nvidia.com/gpumem", Used: int64(p.MemoryMB)},
	}
	if len(got) != len(want) {
		t.Fatalf("got %+v, want %+v", got, want)
	}
	for i := range want {
		g, w := got[i], want[i]
		if g.Namespace != w.Namespace || g.Quota != w.Quota || g.Resource != w.Resource || g.Used != w.Used || (g.Limit == nil) != (w.Limit == nil) || g.Limit != nil && *g.Limit != *w.Limit {
			t.Errorf("row %d: got %+v, want %+v", i, g, w)
		}
	}
}

func ptrTo(v int64) *int64 { return &v }

// TestExplainAndSimulateQuota: explain and simulate refuse as the scheduler does when the
// pod's grant would take its namespace past a GPU quota, with the scheduler's words; simulate
// counts the pods it placed before.
func TestExplainAndSimulateQuota(t *testing.T) {
	n := node(t, "n", a100(t, "GPU-a"))
	n.Status.Allocatable = v1.ResourceList{v1.ResourceCPU: resource.MustParse("32"), v1.ResourceMemory: resource.MustParse("256Gi"), v1.ResourcePods: resource.MustParse("110")}
	running := bound(t, "a", "n", rec("GPU-a", "2g.10gb", 0, 2), rec("GPU-a", "2g.10gb", 2, 2))
	p := policy(t, config.DefaultDeviceConfig())
	p.Quotas = []v1.ResourceQuota{{ObjectMeta: metav1.ObjectMeta{Name: "gpu", Namespace: "default"},
		Spec: v1.ResourceQuotaSpec{Hard: v1.ResourceList{"limits.nvidia.com/gpumem": resource.MustParse("20000")}}}}
	leases := []coordinationv1.Lease{lease("n", time.Now())}
	e, err := Explain(gpuPod("c", "mig", "1000", ""), []v1.Node{n}, []v1.Pod{running}, leases, p, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	want := quota.Reason + ": ResourceQuota default/gpu limits.nvidia.com/gpumem: 19712 used of 20000, and the pod would be granted 4864 on this node"
	if len(e.Nodes) != 1 || e.Nodes[0].Fits || e.Nodes[0].Reason != want {
		t.Errorf("explain: %+v, want %q", e.Nodes, want)
	}
	// Without a's pod, the first fits and the second passes the quota.
	landings := Simulate([]*v1.Pod{gpuPod("d", "mig", "8000", ""), gpuPod("e", "mig", "8000", ""), gpuPod("f", "mig", "1000", "")}, []v1.Node{n}, nil, leases, p, time.Now())
	if landings[0].Node != "n" || landings[1].Node != "n" || landings[2].Node != "" || len(landings[2].Refusals) != 1 {
		t.Errorf("simulate: %+v", landings)
	}
}
