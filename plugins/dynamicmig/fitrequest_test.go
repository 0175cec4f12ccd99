package dynamicmig

import (
	"slices"
	"testing"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	fwk "k8s.io/kube-scheduler/framework"

	"github.com/dynamig/dynamig/api"
)

// withRequests gives the pod's containers requests equal to their limits, as the API server
// defaults extended resources, and cpu millicores each.
func withRequests(p *v1.Pod, cpu string) *v1.Pod {
	for i := range p.Spec.Containers {
		r := p.Spec.Containers[i].Resources.Limits.DeepCopy()
		r[v1.ResourceCPU] = resource.MustParse(cpu)
		p.Spec.Containers[i].Resources.Requests = r
	}
	return p
}

// TestTakeFitRequest: DynamicMIG's PreFilter takes the GPU request's resources and
// HAMi-core's priority out of NodeResourcesFit's request (cpu stays), and its Filter refuses a node short of devices as
// NodeResourcesFit did: Unschedulable while the node's pods hold them, UnschedulableAndUnresolvable
// beyond the allocatable count; NodeResourcesFit still refuses the cpu it lacks.
func TestTakeFitRequest(t *testing.T) {
	node := gpuNode(t, "n", api.ModeMIG, "A100-40GB")
	e := newEnvWithFit(t, []*v1.Node{node})

	first := gpuPod("first", api.ModeMIG, [2]int{1, 4000})
	first.Spec.Containers[0].Resources.Limits[api.ResourcePriority] = resource.MustParse("1")
	first = withRequests(first, "1")
	state, chosen, statuses := e.cycle(first)
	if chosen != "n" {
		t.Fatalf("first: not scheduled: %s", reasons(statuses))
	}
	data, err := state.Read(fitRequestKey)
	if err != nil {
		t.Fatal(err)
	}
	scalars := data.(scalarRequests).GetScalarResources()
	for _, name := range []string{api.ResourceCount, api.ResourceMemory, api.ResourcePriority} {
		if _, ok := scalars[v1.ResourceName(name)]; ok {
			t.Errorf("NodeResourcesFit's request still holds %s: %v", name, scalars)
		}
	}
	if cpu := data.(interface{ GetMilliCPU() int64 }).GetMilliCPU(); cpu != 1000 {
		t.Errorf("NodeResourcesFit's request has %d millicpu, want 1000", cpu)
	}
	e.mustSchedule(first)

	for _, tc := range []struct {
		name        string
		allocatable int64
		cpu         string
		code        fwk.Code
		reason      string
	}{
		{"the node's pods hold its devices", 1, "1", fwk.Unschedulable, "Insufficient nvidia.com/gpu"},
		{"beyond the allocatable count", 0, "1", fwk.UnschedulableAndUnresolvable, "Insufficient nvidia.com/gpu"},
		{"room", 7, "1", fwk.Success, ""},
		{"too much cpu", 7, "64", fwk.UnschedulableAndUnresolvable, "Insufficient cpu"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e.nodes[0].Status.Allocatable[api.ResourceCount] = *resource.NewQuantity(tc.allocatable, resource.DecimalSI)
			_, _, statuses := e.cycle(withRequests(gpuPod("p", api.ModeMIG, [2]int{1, 4000}), tc.cpu))
			st := statuses["n"]
			if st.Code() != tc.code || (tc.reason != "" && !slices.Contains(st.Reasons(), tc.reason)) {
				t.Errorf("node n: %v %v, want %v %q", st.Code(), st.Reasons(), tc.code, tc.reason)
			}
		})
	}
}
