package inspect

import (
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/dynamig/dynamig/api"
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
